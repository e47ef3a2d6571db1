"""The family matrix replayed: every family recorded in ``docs/data/family_matrix.json`` for this
TransformerLens line is built again as a tiny checkpoint and run through the matrix's steps; its
status and refusal reason must be what the docs' table says, and no family may give a number that
differs from its reference (status ``wrong``). Marked ``tl4``: `make test` replays both lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from lens_position.pipeline.family_matrix import MATRIX_FILE, line, run_row

pytestmark = pytest.mark.tl4

ROOT = Path(__file__).resolve().parents[2]
RECORDED = json.loads((ROOT / MATRIX_FILE).read_text(encoding="utf-8"))[f"transformer_lens {line()}"]
ROWS = RECORDED["rows"]
REPLAYED = sorted(name for name, row in ROWS.items() if row["status"] != "not built")
# Every step on families of distinct layouts (separate and fused projections, a key norm over all heads,
# partial rotary, windows declared each way, soft-capping, ALiBi, MLA); the load and its verification on all.
EVERY_STEP = {"llama", "mistral", "mixtral", "qwen3", "gemma2", "gemma3_text", "phi", "phi3", "olmo2", "gpt_neox",
              "starcoder2", "bloom", "cohere", "deepseek_v3"}


def test_the_matrix_covers_every_decoder_family_of_the_installed_transformers():
    assert sorted(ROWS) == sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    assert not [name for name, row in ROWS.items() if row["status"] in ("wrong", "crash")]
    works = [name for name, row in ROWS.items() if row["status"] == "works"]
    assert len(works) >= 40 and {"llama", "mistral", "qwen3", "gemma3_text", "phi3", "olmo2"} <= set(works)


@pytest.mark.parametrize("model_type", REPLAYED)
def test_the_family_does_what_the_matrix_says(model_type, tmp_path):
    recorded = ROWS[model_type]
    full = model_type in EVERY_STEP
    row = run_row(model_type, tmp_path / model_type, steps=full)
    assert row.status not in ("wrong", "crash"), row.message
    assert (row.status, row.reason) == (recorded["status"], recorded["reason"]), row.message
    if row.status == "works":
        assert row.backend == recorded["backend"]
        if full:
            assert row.steps == recorded["steps"]
