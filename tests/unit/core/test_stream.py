"""The streaming loop: one pass per batch feeds every reducer with the rows it covers,
stops at the last layer needed, and applies patches to the prompts they name."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lens_position.analyses.decompose import DecompositionReducer, decompose
from lens_position.analyses.patching import Patch
from lens_position.core.inputs import check_prompts
from lens_position.core.stream import Reducer, needed_stop, stream
from lens_position.ground.errors import BadInputError
from lens_position.models.toy import offset_only_model, random_model, toy_tokens


class ResidualNorm:
    """A new statistic in a few lines: mean ||resid_pre[l]|| per layer over prompts and
    positions, and which prompts were seen."""

    def __init__(self, layers):
        self.hook_names = [f"blocks.{layer}.hook_resid_pre" for layer in layers]
        self.total = {name: 0.0 for name in self.hook_names}
        self.count = {name: 0 for name in self.hook_names}
        self.rows_seen = []

    def update(self, hook_name, activation, rows):
        self.total[hook_name] += float(activation.to(torch.float64).norm(dim=-1).sum())
        self.count[hook_name] += activation.shape[0] * activation.shape[1]
        if hook_name == self.hook_names[0]:
            self.rows_seen += rows.tolist()

    def result(self):
        return {name: self.total[name] / self.count[name] for name in self.hook_names}


class Forbidden:
    """Fails if the pass runs a block it should have stopped before."""

    def __init__(self, layer):
        self.hook_names = [f"blocks.{layer}.hook_resid_post"]

    def update(self, hook_name, activation, rows):
        raise AssertionError(f"{hook_name} ran")


def test_a_new_statistic_is_one_reducer_fed_by_the_same_pass_as_the_decomposition():
    loaded = random_model(n_layers=3, attn_types=("local", "global", "local"))
    tokens = torch.randint(0, 50, (7, 24), generator=torch.Generator().manual_seed(0))
    norms = ResidualNorm([0, 2])
    decomposition = DecompositionReducer(loaded, check_prompts(loaded, tokens), layers=[1])
    assert isinstance(norms, Reducer) and isinstance(decomposition, Reducer)
    stream(loaded, tokens, [norms, decomposition], batch_size=3, progress=False)

    assert norms.rows_seen == list(range(7)), "every prompt once, in order, with its index"
    _, cache = loaded.model.run_with_cache(tokens)
    for layer in (0, 2):
        name = f"blocks.{layer}.hook_resid_pre"
        expected = float(cache[name].to(torch.float64).norm(dim=-1).mean())
        assert norms.result()[name] == pytest.approx(expected, rel=1e-6)
    alone = decompose(loaded, tokens, layers=[1], batch_size=3, progress=False).heads
    shared = decomposition.result().heads
    torch.testing.assert_close(torch.tensor(shared["R"].to_numpy()), torch.tensor(alone["R"].to_numpy()),
                               rtol=0, atol=1e-12)


def test_the_pass_stops_after_the_last_block_any_reducer_reads():
    loaded = random_model(n_layers=3, attn_types=None)
    tokens = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(0))
    assert needed_stop(["blocks.0.hook_resid_pre", "blocks.1.attn.hook_attn_scores"]) == 2
    assert needed_stop(["hook_embed"]) == 0
    assert needed_stop(["ln_final.hook_normalized"]) is None
    # block 1 is needed, block 2 never runs (its resid_post hook would raise)
    stream(loaded, tokens, [ResidualNorm([1])], progress=False)
    with pytest.raises(AssertionError, match="blocks.2.hook_resid_post ran"):
        stream(loaded, tokens, [ResidualNorm([1]), Forbidden(2)], progress=False)


def test_the_pass_ends_within_the_last_block_once_every_hook_it_runs_for_has_run():
    """Reading block 1's attention scores, the rest of block 1 (its MLP) never runs; the
    statistics are those of the whole pass. A hook given by a name filter, or a reader of the
    logits, keeps the pass whole."""
    loaded = random_model(n_layers=3, attn_types=None)
    tokens = torch.randint(0, 50, (5, 12), generator=torch.Generator().manual_seed(0))
    ran = []
    loaded.model.blocks[1].hook_mlp_out.add_hook(lambda activation, hook: ran.append(hook.name))
    try:
        early = DecompositionReducer(loaded, check_prompts(loaded, tokens), layers=[1])
        stream(loaded, tokens, [early], batch_size=2, progress=False)
        assert ran == []
        whole = DecompositionReducer(loaded, check_prompts(loaded, tokens), layers=[1])
        stream(loaded, tokens, [whole], batch_size=2, fwd_hooks=[(lambda name: False, lambda a, hook: a)],
               progress=False)
        assert ran == ["blocks.1.hook_mlp_out"] * 3
    finally:
        loaded.model.reset_hooks(including_permanent=True)
    for name in ("xty_t", "xty_z", "row_t", "sum_y", "sum_y2"):
        assert torch.equal(getattr(early.stats[1], name), getattr(whole.stats[1], name))


def test_per_prompt_patch_values_follow_the_prompts_across_batches():
    """A patch holding one value per prompt gives each prompt its own value whatever the
    batch size: batched and single-pass decompositions agree."""
    loaded = offset_only_model(bos_bonus=2.0)
    tokens = toy_tokens(5, 24)
    values = torch.randn(5, loaded.model.cfg.d_model, generator=torch.Generator().manual_seed(3))
    patch = Patch("hook_embed", values, position=0, label="random embed[0]")
    batched = decompose(loaded, tokens, patches=[patch], batch_size=2, progress=False).heads
    whole = decompose(loaded, tokens, patches=[patch], batch_size=5, progress=False).heads
    torch.testing.assert_close(torch.tensor(batched["R"].to_numpy()), torch.tensor(whole["R"].to_numpy()),
                               rtol=0, atol=1e-12)
    assert not loaded.model.hook_dict["hook_embed"].fwd_hooks, "hooks must be removed"


def test_a_patch_with_rows_touches_only_those_prompts():
    loaded = random_model(n_layers=2)
    tokens = torch.randint(0, 50, (5, 8), generator=torch.Generator().manual_seed(0))
    value = torch.tensor([1.0, 2.0])[:, None, None] * torch.ones(2, 8, loaded.model.cfg.d_model)
    patch = Patch("blocks.0.hook_resid_pre", value,
                  rows=[1, 3])

    class Capture:
        hook_names = ["blocks.0.hook_resid_pre"]

        def __init__(self):
            self.seen = {}

        def update(self, hook_name, activation, rows):
            for row, act in zip(rows.tolist(), activation):
                self.seen[row] = act.clone()

    capture = Capture()
    stream(loaded, tokens, [capture], patches=[patch], batch_size=2, progress=False)
    _, cache = loaded.model.run_with_cache(tokens, names_filter="blocks.0.hook_resid_pre")
    base = cache["blocks.0.hook_resid_pre"]
    for row in (0, 2, 4):
        assert torch.equal(capture.seen[row], base[row])
    assert (capture.seen[1] == 1.0).all() and (capture.seen[3] == 2.0).all()


def test_unknown_hooks_are_refused():
    loaded = random_model(n_layers=2)

    class Bad:
        hook_names = ["blocks.9.hook_resid_pre"]

        def update(self, hook_name, activation, rows):
            pass

    with pytest.raises(BadInputError, match="no hooks named"):
        stream(loaded, torch.zeros(1, 4, dtype=torch.long), [Bad()], progress=False)


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.float64]),
       length=st.integers(2, 3000), fault=st.sampled_from([None, "nan", "+inf", "-inf", "zeroed row"]),
       data=st.data())
def test_a_pattern_passes_the_check_exactly_when_every_row_is_a_distribution(dtype, length, fault, data):
    """A causal softmax pattern of any dtype and length passes; one NaN, infinity or zeroed row (the
    zeros TransformerLens writes for a NaN row) is a NonFiniteError naming its head and position."""
    from lens_position.core.stream import check_finite_activation
    from lens_position.ground.errors import NonFiniteError

    generator = torch.Generator().manual_seed(data.draw(st.integers(0, 1000)))
    n_heads, n_queries = 2, min(length, 5)
    logits = torch.randn(1, n_heads, n_queries, length, generator=generator, dtype=torch.float64) * 3
    queries = torch.arange(length - n_queries, length)[:, None]
    pattern = logits.masked_fill(torch.arange(length) > queries, -torch.inf).softmax(-1).to(dtype)
    head, query = data.draw(st.integers(0, n_heads - 1)), data.draw(st.integers(0, n_queries - 1))
    if fault == "zeroed row":
        pattern[0, head, query] = 0.0
    elif fault is not None:
        pattern[0, head, query, data.draw(st.integers(0, length - 1))] = float(fault)
    model = torch.nn.Linear(1, 1)
    if fault is None:
        check_finite_activation("blocks.0.attn.hook_pattern", pattern, torch.tensor([3]), model)
        return
    with pytest.raises(NonFiniteError, match=rf"hook_pattern \(layer 0, head {head}, prompt 3, position {query}"):
        check_finite_activation("blocks.0.attn.hook_pattern", pattern, torch.tensor([3]), model)
