"""Positional leakage in the authors' mode against a port of their notebook (tests/helpers/once_upon_a_token.py)
on the same inputs: the same numbers, head by head. Runs on both TransformerLens lines (tl4)."""

import numpy as np
import pytest
import torch

from lens_position.analyses.leakage import leakage_texts, positional_leakage
from lens_position.models.tiny import tiny_hf_model
from tests.helpers import once_upon_a_token as notebook

pytestmark = pytest.mark.tl4
TEXTS = leakage_texts()[:12]


def _encoder(tokenizer):
    def encode(text, max_len):
        return tokenizer(text, return_tensors="pt", truncation=True, max_length=max_len,
                         add_special_tokens=False)["input_ids"]
    return encode


def _compare(loaded, n_samples, max_len=256):
    ours = positional_leakage(loaded, TEXTS, mode="authors", n_samples=n_samples, max_length=max_len,
                              progress=False)
    rows = notebook.robust_leakage_significance(
        notebook.lens_position_forward(loaded), _encoder(loaded.tokenizer), TEXTS, loaded.spec.n_layers,
        n_samples=n_samples, max_len=max_len)
    heads = ours.heads
    assert len(heads) == len(rows)
    for row, (_, mine) in zip(rows, heads.iterrows()):
        assert (int(mine["layer"]), int(mine["head"])) == (row["layer"], row["head"])
        assert mine["delta_r2"] == pytest.approx(row["real"].mean(), abs=1e-12)
        assert mine["delta_r2_null"] == pytest.approx(row["null"].mean(), abs=1e-12)
        for column, key in (("leakage_gap", "mean_gap"), ("leakage_gap_lo", "ci_lo"), ("leakage_gap_hi", "ci_hi"),
                            ("p_value", "p"), ("q_value", "q")):
            assert mine[column] == pytest.approx(row[key], abs=1e-12), (column, row["layer"], row["head"])
        assert bool(mine["significant"]) == row["significant"]
    return ours


def test_authors_mode_gives_the_notebooks_numbers_head_by_head(tiny_llama):
    _compare(tiny_llama, n_samples=6)


def test_authors_band_shares_are_the_notebooks(tiny_llama):
    ours = positional_leakage(tiny_llama, TEXTS, mode="authors", n_samples=2, n_boot=20, n_perm=20, progress=False)
    notebook.TRACE.clear()
    ids = _encoder(tiny_llama.tokenizer)(" ".join(TEXTS[:5]), 256)
    notebook.lens_position_forward(tiny_llama)(ids)
    shares = notebook.band_shares(tiny_llama.spec.n_layers, rotary_dim=tiny_llama.spec.d_head)
    for layer, heads in shares.items():
        for h, per_band in enumerate(heads):
            mine = ours.bands[(ours.bands["layer"] == layer) & (ours.bands["head"] == h)]
            assert list(mine["band"]) == list(per_band)
            np.testing.assert_allclose(mine["energy_share"].to_numpy(), list(per_band.values()), atol=1e-12)


def test_the_notebooks_own_hook_captures_what_lens_position_reads(tiny_llama):
    """Their capture (apply_rotary_pos_emb wrapped in the Hugging Face Llama) and the hooks lens_position
    reads give the same rotated queries and keys on the same ids."""
    hf_model, tokenizer = tiny_hf_model("tiny-llama")
    ids = _encoder(tokenizer)(TEXTS[0], 256)
    notebook.TRACE.clear()
    with notebook.notebook_hooks(hf_model) as forward, torch.no_grad():
        forward(ids)
    theirs = {layer: dict(entries[-1]) for layer, entries in notebook.TRACE.items()}
    notebook.TRACE.clear()
    notebook.lens_position_forward(tiny_llama)(ids)
    for layer, entry in theirs.items():
        ours = notebook.TRACE[layer][-1]
        k_theirs = entry["k_rot"].repeat_interleave(ours["k_rot"].shape[1] // entry["k_rot"].shape[1], dim=1)
        torch.testing.assert_close(ours["q_rot"], entry["q_rot"], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours["k_rot"], k_theirs, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_authors_mode_gives_the_notebooks_numbers_on_smollm2(smollm2):
    _compare(smollm2, n_samples=3, max_len=64)
