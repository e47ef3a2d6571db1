"""Prompt sets: sources, BOS policies, determinism and the errors a user can act on."""

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lens_position.core.data import build_prompts, default_corpus, load_corpus, tokenizer_prepends_bos
from lens_position.ground.errors import BadInputError, ResourceError
from lens_position.models.toy import BOS_TOKEN_ID, random_model


def test_same_spec_gives_same_tokens_and_other_seed_other_tokens(tiny_llama):
    for source in ("natural", "random", "repeated"):
        a = build_prompts(tiny_llama, source=source, T=24, N=4, seed=3)
        b = build_prompts(tiny_llama, source=source, T=24, N=4, seed=3)
        c = build_prompts(tiny_llama, source=source, T=24, N=4, seed=4)
        assert torch.equal(a.tokens, b.tokens) and a.spec == b.spec
        assert not torch.equal(a.tokens, c.tokens)
        assert a.tokens.shape == (4, 24) and a.tokens.dtype == torch.int64


def test_natural_text_is_windows_of_the_default_corpus(tiny_llama):
    prompts = build_prompts(tiny_llama, T=40, N=3, bos="none", seed=0)
    corpus = default_corpus()
    assert prompts.spec.corpus == "pydoc_data.topics" and prompts.spec.corpus_tokens > 100_000
    for row in prompts.tokens:
        assert tiny_llama.tokenizer.decode(row) in corpus  # byte tokenizer: windows are exact substrings
    starts = prompts.spec.window_starts
    assert list(starts) == sorted(starts) and all(b - a >= 40 for a, b in zip(starts, starts[1:]))


def test_bos_policies_decide_position_zero(tiny_llama, tiny_gemma3):
    # the tokenizer's own policy: Gemma-3 style prepends <bos>, Llama/SmolLM2 style does not
    assert tokenizer_prepends_bos(tiny_gemma3.tokenizer) and not tokenizer_prepends_bos(tiny_llama.tokenizer)
    gemma = build_prompts(tiny_gemma3, T=16, N=2, bos="tokenizer")
    llama = build_prompts(tiny_llama, T=16, N=2, bos="tokenizer")
    assert gemma.has_bos and (gemma.tokens[:, 0] == gemma.bos_token_id).all()
    assert not llama.has_bos and llama.spec.first_token_id is None
    forced = build_prompts(tiny_llama, T=16, N=2, bos="force")
    assert forced.has_bos and (forced.tokens[:, 0] == tiny_llama.tokenizer.bos_token_id).all()
    # the text after position 0 is the same window whether a BOS is forced or chosen
    chosen = build_prompts(tiny_llama, T=16, N=2, bos="token:x")
    assert (chosen.tokens[:, 0] == tiny_llama.tokenizer("x", add_special_tokens=False)["input_ids"][0]).all()
    assert torch.equal(chosen.tokens[:, 1:], forced.tokens[:, 1:])
    assert chosen.spec.position0 == "token" and not chosen.has_bos
    by_id = build_prompts(tiny_llama, T=16, N=2, bos="token:7")
    assert (by_id.tokens[:, 0] == 7).all()
    stripped = build_prompts(tiny_gemma3, T=16, N=2, bos="none")
    assert not stripped.has_bos and (stripped.tokens != stripped.bos_token_id).all()


def test_random_tokens_avoid_special_tokens_and_repeated_sequences_repeat(tiny_llama):
    special = set(tiny_llama.tokenizer.all_special_ids)
    random = build_prompts(tiny_llama, source="random", T=64, N=8, bos="none")
    assert not special & set(random.tokens.unique().tolist())
    assert len(random.tokens.unique()) > 100
    repeated = build_prompts(tiny_llama, source="repeated", T=32, N=6, bos="force")
    body = repeated.tokens[:, 1:]
    assert (body == body[:, :1]).all() and len(body[:, 0].unique()) > 1
    assert not special & set(body.unique().tolist())


def test_text_files_folders_and_literal_text(tiny_llama, tmp_path):
    (tmp_path / "a.txt").write_text("alpha " * 100)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.md").write_text("beta " * 100)
    (tmp_path / "ignored.bin").write_bytes(b"\x00\x01")
    text, description = load_corpus(tmp_path)
    assert text.index("alpha") < text.index("beta") and description.startswith("folder:")
    from_file = build_prompts(tiny_llama, T=20, N=4, bos="none", corpus=tmp_path / "a.txt")
    assert set(tiny_llama.tokenizer.decode(from_file.tokens[0])) <= set("alph ")
    from_text = build_prompts(tiny_llama, T=20, N=4, bos="none", text="gamma " * 100)
    assert from_text.spec.corpus == "text"
    assert set(tiny_llama.tokenizer.decode(from_text.tokens[0])) <= set("gamma ")


def test_datasets_split_from_a_saved_dataset(tiny_llama, tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": ["delta epsilon " * 50, "zeta " * 50]}).save_to_disk(str(tmp_path / "ds"))
    prompts = build_prompts(tiny_llama, T=32, N=4, bos="force", corpus=f"hf:{tmp_path / 'ds'}:train")
    assert prompts.spec.corpus.startswith("hf:") and prompts.tokens.shape == (4, 32)
    with pytest.raises(BadInputError, match="column"):
        build_prompts(tiny_llama, T=32, N=4, corpus=f"hf:{tmp_path / 'ds'}:train:body")


def test_clear_errors(tiny_llama, tmp_path):
    with pytest.raises(BadInputError, match="too little text"):
        build_prompts(tiny_llama, T=64, N=4, text="short text")
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(BadInputError, match="empty"):
        build_prompts(tiny_llama, corpus=tmp_path / "empty.txt")
    with pytest.raises(BadInputError, match="not one"):
        build_prompts(tiny_llama, bos="token:two tokens")
    with pytest.raises(BadInputError, match="outside the vocabulary"):
        build_prompts(tiny_llama, bos="token:100000")
    with pytest.raises(BadInputError, match="BOS policy"):
        build_prompts(tiny_llama, bos="sometimes")
    with pytest.raises(BadInputError, match="neither a file"):
        build_prompts(tiny_llama, corpus=tmp_path / "missing.txt")
    with pytest.raises(BadInputError, match="source"):
        build_prompts(tiny_llama, source="poetry")


def test_models_without_tokenizer_get_random_tokens_and_a_chosen_bos():
    loaded = random_model(d_vocab=50)
    prompts = build_prompts(loaded, source="random", T=12, N=3, bos="force")
    assert (prompts.tokens[:, 0] == BOS_TOKEN_ID).all() and prompts.tokens.max() < 50
    assert (prompts.tokens[:, 1:] != BOS_TOKEN_ID).all()
    with pytest.raises(BadInputError, match="tokenizer"):
        build_prompts(loaded, source="natural")


@pytest.mark.fault(area="options", given="N or T so large that the prompt set cannot be built (--N 1000000000)",
                   happens="refused before allocating: ResourceError with the largest N that fits, never the "
                           "allocator's raw error")
@given(N=st.integers(1, 10**10), T=st.integers(2, 10**6), available=st.integers(0, 2**40))
@settings(max_examples=200, deadline=None)
def test_a_prompt_set_is_refused_exactly_when_it_cannot_be_built_and_the_route_fits(N, T, available):
    from lens_position.core import data

    needed = data._BUILD_COPIES * N * T * 8
    if needed <= available:
        data._check_tokens_fit(N, T, available)
        return
    with pytest.raises(ResourceError, match=r"use N <= ([\d,]+)") as error:
        data._check_tokens_fit(N, T, available)
    fits = int(re.search(r"use N <= ([\d,]+)", str(error.value)).group(1).replace(",", ""))
    assert fits < N and data._BUILD_COPIES * fits * T * 8 <= available < data._BUILD_COPIES * (fits + 1) * T * 8


def test_build_prompts_refuses_a_set_the_host_cannot_hold(monkeypatch):
    from lens_position.core import data

    monkeypatch.setattr(data, "host_available_bytes", lambda: 1 << 20)
    with pytest.raises(ResourceError, match="N <= 341"):
        build_prompts(random_model(n_layers=1), source="random", T=128, N=10**6, bos="none")
