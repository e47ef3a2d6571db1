"""The mask/residual decomposition against its ground truths (DESIGN.md §2) on hand-set
tiny models, and the streamed statistics against a dense reference."""

import hashlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lens_position.analyses.decompose import (
    PairDesign,
    PositionBins,
    check_identity,
    decompose,
    decompose_dense,
    self_referenced_scores,
)
from lens_position.core.inputs import check_prompts
from lens_position.ground.errors import BadInputError, ContextLengthError, UnsupportedArchitectureError
from lens_position.models.toy import offset_only_model, random_model, toy_tokens

LENGTH = 48


def scores_of(loaded, tokens, layer=0):
    _, cache = loaded.model.run_with_cache(tokens, names_filter=f"blocks.{layer}.attn.hook_attn_scores")
    return cache[f"blocks.{layer}.attn.hook_attn_scores"]


def offset_function(loaded, length):
    """g[h, d] read off the last query row, after checking s[i, j] = g(i - j) everywhere."""
    scores = scores_of(loaded, toy_tokens(1, length, bos=False))[0]
    g = scores[:, -1].flip(-1)
    i, j = torch.meshgrid(torch.arange(length), torch.arange(length), indexing="ij")
    causal = j <= i
    expected = g[:, (i - j).clamp(min=0)]
    assert (scores - expected)[:, causal].abs().max() < 1e-12, "the toy model is not offset-only"
    return g


def absolute_variance(design, target):
    """Var over pairs of (full fit - relative fit) by explicit numpy least squares."""
    x = design.dense().numpy()
    x_rel = x[:, design.relative.numpy()]
    full = x @ np.linalg.lstsq(x, target, rcond=None)[0]
    rel = x_rel @ np.linalg.lstsq(x_rel, target, rcond=None)[0]
    return np.var(full - rel)


def test_offset_only_scores_have_zero_residual_component():
    loaded = offset_only_model(n_heads=2, n_kv_heads=1)
    result = decompose(loaded, toy_tokens(4, LENGTH, bos=False), batch_size=3, progress=False)
    heads = result.heads
    assert (heads.R.abs() < 1e-12).all() and (heads.R_heldout.abs() < 1e-12).all()
    assert (heads.C.abs() < 1e-12).all()
    assert (heads.M > 0.01).all()

    # M from the closed form z[i] = log sum_{d<=i} exp(g(d) - g(0)), fitted independently
    g = offset_function(loaded, LENGTH).numpy()
    design = PairDesign.build(LENGTH, None, 0, LENGTH, "all", PositionBins())
    d = (design.query - design.key).numpy()
    for head in range(2):
        t = g[head, d] - g[head, 0]
        z_of_query = np.logaddexp.accumulate(g[head] - g[head, 0])
        z = z_of_query[design.query.numpy()]
        expected_m = absolute_variance(design, z) / np.var(t - z)
        assert heads.M[head] == pytest.approx(expected_m, rel=1e-9, abs=1e-12)
        assert heads["total"][head] == pytest.approx(expected_m, rel=1e-9, abs=1e-12)


def test_uniform_attention_is_all_mask():
    loaded = offset_only_model(uniform=True, n_heads=2)
    tokens = toy_tokens(3, LENGTH, bos=False)
    heads = decompose(loaded, tokens, progress=False).heads
    assert (heads.R.abs() < 1e-12).all() and (heads.C.abs() < 1e-12).all()
    assert (heads.M > 0.01).all()
    np.testing.assert_allclose(heads.M, heads["total"], rtol=1e-12)
    # log A[i, j] = -log(i + 1): the pattern itself
    _, cache = loaded.model.run_with_cache(tokens, names_filter="blocks.0.attn.hook_pattern")
    pattern = cache["blocks.0.attn.hook_pattern"][0, 0]
    i = torch.arange(LENGTH)[:, None].to(pattern.dtype)
    assert torch.allclose(pattern, torch.tril(torch.ones_like(pattern)) / (i + 1), atol=1e-14)


def test_sliding_window_offset_only_has_no_mask_component_once_the_window_is_full():
    window = 6
    tokens = toy_tokens(3, LENGTH, bos=False)
    full_window = (window - 1, LENGTH)
    local = decompose(offset_only_model(window=window), tokens, query_range=full_window, progress=False).heads
    assert (local.layer_type == "local").all() and (local.window == window).all()
    assert (local.M.abs() < 1e-12).all() and (local.R.abs() < 1e-12).all() and (local["total"].abs() < 1e-12).all()
    # the same queries under a causal mask do carry a mask component
    causal = decompose(offset_only_model(), tokens, query_range=full_window, progress=False).heads
    assert (causal.M > 1e-3).all()


def test_key0_bonus_gives_residual_component_that_vanishes_without_it():
    tokens = toy_tokens(6, LENGTH, bos=True)
    with_bonus = decompose(offset_only_model(bos_bonus=2.0), tokens, progress=False).heads
    assert (with_bonus.R > 0.01).all() and (with_bonus.R_heldout > 0.01).all()
    without_bonus = decompose(offset_only_model(bos_bonus=0.0), tokens, progress=False).heads
    assert (without_bonus.R.abs() < 1e-12).all()
    # the bonus is carried by the residual stream at position 0: a non-BOS token there removes it
    not_bos = decompose(offset_only_model(bos_bonus=2.0), toy_tokens(6, LENGTH, bos=False), progress=False).heads
    assert (not_bos.R.abs() < 1e-12).all()


def test_fwd_hooks_act_on_the_analysed_pass():
    """Erasing the BOS marker from the embedding (a C4-style intervention) removes R."""
    loaded = offset_only_model(bos_bonus=2.0)

    def erase_bos_marker(embed, hook):
        embed = embed.clone()
        embed[:, 0, 1] = 0.0
        return embed

    heads = decompose(loaded, toy_tokens(4, LENGTH), fwd_hooks=[("hook_embed", erase_bos_marker)],
                      progress=False).heads
    assert (heads.R.abs() < 1e-12).all()
    assert decompose(loaded, toy_tokens(4, LENGTH), progress=False).heads.R.min() > 0.01
    assert not loaded.model.hook_dict["hook_embed"].fwd_hooks, "hooks must be removed"


@pytest.mark.parametrize("options", [
    dict(), dict(keys="no-bos"), dict(query_range=(2, 30)), dict(query_range=(0, 32), keys="no-bos"),
])
def test_streamed_statistics_equal_the_dense_reference(options):
    loaded = random_model(n_layers=2, attn_types=("local", "global"), window=8, n_heads=4, n_kv_heads=2)
    tokens = torch.randint(0, 50, (7, 40), generator=torch.Generator().manual_seed(1))
    streamed = decompose(loaded, tokens, batch_size=3, progress=False, **options).heads
    dense = decompose_dense(loaded, tokens, **options).heads
    assert list(streamed.layer_type) == list(dense.layer_type) == ["local"] * 4 + ["global"] * 4
    numeric = ["total", "R", "M", "C", "total_heldout", "R_heldout", "M_heldout", "C_heldout",
               "var_logA", "var_abs_t", "var_abs_z", "cov_abs_tz", "n_pairs"]
    np.testing.assert_allclose(streamed[numeric].to_numpy(float), dense[numeric].to_numpy(float), rtol=0, atol=1e-6)
    np.testing.assert_allclose(streamed["total"], streamed.R + streamed.M + streamed.C, atol=1e-12)
    assert (streamed["total"].between(0, 1)).all()


def test_heldout_total_is_what_one_half_explains_of_the_other():
    """total_heldout (streamed, from statistics) equals Cov(abs_A, log A_B)/V_B averaged both ways,
    computed explicitly by the dense reference; it is below the in-sample T on noise."""
    loaded = random_model(n_layers=1, attn_types=None, window=None)
    tokens = torch.randint(0, 50, (10, 32), generator=torch.Generator().manual_seed(2))
    streamed = decompose(loaded, tokens, batch_size=4, progress=False).heads
    dense = decompose_dense(loaded, tokens).heads
    np.testing.assert_allclose(streamed.total_heldout, dense.total_heldout, atol=1e-9)
    assert (streamed.total_heldout < streamed["total"]).all()


def test_result_is_independent_of_batch_size():
    loaded = random_model()
    tokens = torch.randint(0, 50, (6, 24), generator=torch.Generator().manual_seed(3))
    a = decompose(loaded, tokens, batch_size=1, progress=False).heads
    b = decompose(loaded, tokens, batch_size=6, progress=False).heads
    columns = ["total", "R", "M", "C", "total_heldout"]
    np.testing.assert_allclose(a[columns], b[columns], atol=1e-12)


def test_layers_frame_and_provenance():
    loaded = random_model(n_layers=3, attn_types=("local", "local", "global"))
    tokens = torch.randint(0, 50, (2, 24), generator=torch.Generator().manual_seed(4))
    result = decompose(loaded, tokens, layers=[0, 2], query_range=(0, 16), progress=False)
    assert list(result.layers.layer) == [0, 2] and list(result.layers.layer_type) == ["local", "global"]
    np.testing.assert_allclose(result.layers.R, result.heads.groupby("layer").R.mean())
    options = result.provenance["options"]
    assert options["query_range"] == [0, 16] and options["keys"] == "all"
    assert options["bins"]["position_edges"][:3] == [0, 1, 2]
    assert result.provenance["model"]["n_layers"] == 3
    data = result.provenance["data"]
    assert (data["source"], data["N"], data["T"]) == ("tokens", 2, 24)
    assert data["extra"]["tokens_sha256"] == hashlib.sha256(tokens.numpy().tobytes()).hexdigest()


def test_one_sequence_has_no_heldout_values():
    heads = decompose(random_model(), torch.randint(0, 50, (1, 16)), progress=False).heads
    assert heads.total_heldout.isna().all() and heads["total"].notna().all()


def test_identity_log_a_equals_t_minus_z_on_a_random_model():
    loaded = random_model()
    errors = check_identity(loaded, torch.randint(0, 50, (2, 32), generator=torch.Generator().manual_seed(5)))
    assert (errors.max_abs_error_pattern < 1e-6).all() and (errors.max_abs_error_log < 1e-4).all()


def test_bad_options_raise_actionable_errors():
    loaded = random_model(n_ctx=32)
    tokens = torch.arange(32).view(2, 16) % 50
    with pytest.raises(ContextLengthError, match="n_ctx"):
        decompose(loaded, torch.zeros(1, 40, dtype=torch.long), progress=False)
    with pytest.raises(BadInputError, match="query_range"):
        decompose(loaded, tokens, query_range=(10, 5), progress=False)
    with pytest.raises(BadInputError, match="keys"):
        decompose(loaded, tokens, keys="some", progress=False)
    with pytest.raises(BadInputError, match="layers"):
        decompose(loaded, tokens, layers=[5], progress=False)
    with pytest.raises(BadInputError, match="shape"):
        decompose(loaded, torch.zeros(2, 16, 1, dtype=torch.long), progress=False)
    loaded.model.cfg.attention_dir = "bidirectional"
    with pytest.raises(UnsupportedArchitectureError, match="causal"):
        decompose(loaded, tokens, progress=False)


def test_registry_gemma3_layout_streamed_equals_dense(tiny_gemma3):
    """Gemma-3 layout (QK-norm, 4 query heads on 1 key/value head, local window 16, then global)."""
    from lens_position.core.data import build_prompts

    prompts = build_prompts(tiny_gemma3, T=40, N=5, seed=1)
    streamed = decompose(tiny_gemma3, prompts, layers=[3, 4, 5], batch_size=2, progress=False)
    dense = decompose_dense(tiny_gemma3, prompts, layers=[3, 4, 5])
    assert list(streamed.layers.layer_type) == ["local", "local", "global"]
    assert list(streamed.heads.window.dropna().unique()) == [16]
    numeric = ["total", "R", "M", "C", "total_heldout", "R_heldout", "M_heldout", "C_heldout"]
    np.testing.assert_allclose(streamed.heads[numeric], dense.heads[numeric], atol=1e-6)
    assert streamed.provenance["data"]["source"] == "natural"
    assert streamed.provenance["seed"] == 1


def test_streaming_keeps_no_attention_scores():
    """Every batch's T x T scores are freed once reduced: memory does not grow with N."""
    import gc
    import weakref

    seen = []

    def remember(scores, hook):
        seen.append(weakref.ref(scores))

    loaded = random_model()
    tokens = torch.randint(0, 50, (12, 32), generator=torch.Generator().manual_seed(6))
    result = decompose(loaded, tokens, batch_size=2, fwd_hooks=[(lambda name: name.endswith("hook_attn_scores"),
                                                                 remember)], progress=False)
    gc.collect()
    assert len(seen) == 2 * 6 and all(ref() is None for ref in seen)
    assert len(result.heads) == 2 * 4


def test_a_bootstrap_replicate_is_the_decomposition_of_its_resampled_sequences(monkeypatch):
    """A replicate re-weights the sequences' statistics by their multiplicities and refits; it
    must be the decomposition of the resampled sequences themselves, every component (in-sample,
    held-out, reference-free), per head and per layer. The resampled sequences keep their halves
    (even indices half 0, odd half 1), as the stratified draws do. A sliding-window layer (window
    8 < T) and two global ones (refitted together); the replicates refitted a few at a time."""
    from lens_position.analyses.decompose import COMPONENTS, HEAD_REPLICATE_COMPONENTS, DecompositionReducer
    from lens_position.analyses.engine import fit as fit_module
    from lens_position.core.intervals import NO_INTERVALS, Bootstrap
    from lens_position.core.stream import stream

    monkeypatch.setattr(fit_module, "REFIT_BLOCK_VALUES", 5000)  # several blocks of heads
    loaded = random_model(n_layers=3, attn_types=("global", "local", "global"))
    tokens = torch.randint(0, 50, (8, 24), generator=torch.Generator().manual_seed(7))
    reducer = DecompositionReducer(loaded, check_prompts(loaded, tokens), query_range=(2, 24),
                                   bootstrap=Bootstrap(n_resamples=70))
    stream(loaded, tokens, [reducer], batch_size=3, progress=False)
    result = reducer.result()
    counts = reducer.resample_weights().long()
    widening = np.sqrt(4 / 3)  # the replicates' spread is widened by sqrt(m / (m - 1)), m = 4 per half
    layer_estimates = result.heads.groupby("layer")[COMPONENTS].mean()
    for b in (0, 33, 69):
        halves = [[n for n in range(half, 8, 2) for _ in range(int(counts[b, n]))] for half in (0, 1)]
        order = [n for pair in zip(*halves) for n in pair]
        direct = decompose(loaded, tokens[order], query_range=(2, 24), bootstrap=NO_INTERVALS, progress=False)
        heads = result.head_replicates[result.head_replicates.replicate == b].sort_values(["layer", "head"])
        for name in HEAD_REPLICATE_COMPONENTS:
            estimate = result.heads[name].to_numpy()
            refit = estimate + (heads[name].to_numpy() - estimate) / widening
            np.testing.assert_allclose(refit, direct.heads[name], rtol=1e-9, atol=1e-12)
        layers = result.replicates[result.replicates.replicate == b].set_index("layer")[COMPONENTS]
        refit = layer_estimates + (layers - layer_estimates) / widening
        np.testing.assert_allclose(refit.to_numpy(), direct.layers.set_index("layer")[COMPONENTS].to_numpy(),
                                   rtol=1e-9, atol=1e-12)


@pytest.fixture(scope="module")
def eight_sequence_fit():
    """The statistics of 8 sequences (8 groups, halves of 4) on a global and a sliding-window layer,
    refitted side by side as in ``result()``, and the bootstrap's draws."""
    from lens_position.analyses.decompose import DecompositionReducer, HeadStatistics
    from lens_position.analyses.engine.fit import Fitter
    from lens_position.core.stream import stream

    loaded = random_model(n_layers=2, attn_types=("global", "local"))
    tokens = torch.randint(0, 50, (8, 20), generator=torch.Generator().manual_seed(3))
    reducer = DecompositionReducer(loaded, check_prompts(loaded, tokens), query_range=(1, 20))
    stream(loaded, tokens, [reducer], batch_size=8, progress=False)
    fits = [
        (
            Fitter(design),
            HeadStatistics.side_by_side(
                [reducer.stats[layer] for layer in reducer.layers if reducer.windows[layer] == window]
            ),
        )
        for window, design in reducer.designs.items()
    ]
    return fits, reducer.resample_weights()


def _one_row_at_a_time(fit, stats, weights):
    from lens_position.analyses.engine.fit import components

    rows = [components(fit, stats, weights[i : i + 1]) for i in range(len(weights))]
    return {name: torch.cat([row[name] for row in rows]) for name in rows[0]}


def _assert_same_components(got, expected):
    assert got.keys() == expected.keys()
    for name in expected:
        assert got[name].shape == expected[name].shape, name
        assert torch.equal(got[name].isnan(), expected[name].isnan()), name
        torch.testing.assert_close(got[name], expected[name], rtol=1e-11, atol=1e-13, equal_nan=True, msg=name)


def test_every_bootstrap_replicate_gets_the_refit_of_its_own_weighting(eight_sequence_fit, monkeypatch):
    """Replicates that drew the same sequences share one refit, as do equal weightings of a half: with
    halves of 4 sequences many repeat. Every replicate must still get the components of its own
    weighting: refitting all 200 together equals refitting each alone, and only the distinct
    weightings (of all groups, and of each half) are refitted."""
    from lens_position.analyses.engine import fit as fit_module
    from lens_position.analyses.engine.fit import components

    fits, weights = eight_sequence_fit
    halves = fits[0][1].halves.to(torch.float64)
    distinct = len(torch.unique(weights, dim=0))
    distinct_halves = len(torch.unique(torch.cat([weights * (1 - halves), weights * halves]), dim=0))
    assert distinct < len(weights) and distinct_halves < len(weights)  # the draws do repeat
    for fit, stats in fits:
        refitted_rows = []
        variant = fit_module.fit_variant
        def counting(*args, refitted_rows=refitted_rows, variant=variant):
            refitted_rows.append(len(args[-1]))
            return variant(*args)

        monkeypatch.setattr(fit_module, "fit_variant", counting)
        together = components(fit, stats, weights)
        monkeypatch.setattr(fit_module, "fit_variant", variant)
        assert sum(refitted_rows) == distinct + distinct_halves
        _assert_same_components(together, _one_row_at_a_time(fit, stats, weights))


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_refitting_weightings_together_equals_refitting_each_alone(eight_sequence_fit, data):
    """Any multiplicities (repeated rows, rows in any order, a half or every group left out): the
    components of a weighting do not depend on which other weightings are refitted with it."""
    from lens_position.analyses.engine.fit import components

    fits, _ = eight_sequence_fit
    pool = data.draw(st.lists(st.lists(st.integers(0, 3), min_size=8, max_size=8), min_size=1, max_size=4))
    rows = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=10))
    weights = torch.tensor(rows, dtype=torch.float64)
    fit, stats = fits[data.draw(st.sampled_from([0, 1]))]
    _assert_same_components(components(fit, stats, weights), _one_row_at_a_time(fit, stats, weights))


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=64),
                                 st.floats(-750.0, 710.0), st.floats(-1e-3, 1e-3)), min_size=1, max_size=60),
       step=st.integers(1, 3), numpy_path=st.booleans())
def test_exp_and_log_equal_torchs_on_any_float64(values, step, numpy_path):
    """The float64 ``exp`` and ``log`` the reduction and the refits use (numpy's where it is vectorised,
    else torch's) give torch's values to one unit in the last place, and the same infinities, zeros and
    NaNs: over any float64 (subnormal results, overflow, -inf, NaN), on strided views, into a given
    output and in place."""
    from lens_position.analyses.engine import kernels

    x = torch.tensor(values, dtype=torch.float64)[::step]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kernels, "NUMPY_VECTOR_MATH", numpy_path)
        _check_exp_and_log(kernels, x)


def _check_exp_and_log(kernels, x):
    out = torch.empty_like(x)
    assert kernels.fast_exp(x, out=out) is out
    for got in (kernels.fast_exp(x), out):
        torch.testing.assert_close(got, torch.exp(x), rtol=4e-16, atol=0.0, equal_nan=True)
    positive = x.abs()
    got = kernels.fast_log_(positive.clone())
    torch.testing.assert_close(got, positive.log(), rtol=0.0, atol=1e-15, equal_nan=True)
    wide = torch.stack([positive, positive]).T  # a non-contiguous [n, 2] view, logged in place
    kernels.fast_log_(wide)
    torch.testing.assert_close(wide[:, 0], positive.log(), rtol=0.0, atol=1e-15, equal_nan=True)


def test_fast_logcumsumexp_equals_torchs():
    """The refits' cumulative logsumexp (shift by the row's maximum, exp, cumsum, log) against
    torch.logcumsumexp: float64 round-off on ordinary rows, and torch's own values on rows where
    the shifted prefix underflows, that are constant, or that hold NaN or -inf."""
    from lens_position.analyses.engine.kernels import fast_logcumsumexp

    x = torch.randn(50, 3, 64, generator=torch.Generator().manual_seed(8), dtype=torch.float64) * 20
    x[0, 0, :3] = -2000.0  # the first values underflow after the shift
    x[1, 1] = 3.0
    x[2, 2, 5] = float("nan")
    x[3, 0, :4] = float("-inf")
    x[4, 1] = float("-inf")
    fast, exact = fast_logcumsumexp(x), torch.logcumsumexp(x, dim=-1)
    assert torch.equal(fast.isnan(), exact.isnan()) and torch.equal(fast.isinf(), exact.isinf())
    finite = exact.isfinite()
    torch.testing.assert_close(fast[finite], exact[finite], rtol=1e-13, atol=1e-13)
    for row in ((0, 0), (2, 2), (3, 0), (4, 1)):
        assert torch.equal(fast[row].nan_to_num(), exact[row].nan_to_num())


@pytest.mark.parametrize("options", [dict(), dict(query_range=(3, 37), keys="no-bos")])
@pytest.mark.parametrize("bootstrap_on", [True, False])
def test_statistics_do_not_depend_on_how_the_queries_are_blocked(monkeypatch, options, bootstrap_on):
    """The reduction works on blocks of query rows, each over the keys its queries see; any
    block size gives the same sums (float64 round-off), on a sliding-window layer and a global
    one, with a query range, and with several sequences per group (intervals off: two halves)."""
    from lens_position.analyses.decompose import DecompositionReducer
    from lens_position.analyses.engine import statistics
    from lens_position.core.intervals import NO_INTERVALS, Bootstrap
    from lens_position.core.stream import stream

    loaded = random_model(n_layers=2, attn_types=("local", "global"), window=8, n_heads=4, n_kv_heads=2)
    tokens = torch.randint(0, 50, (7, 40), generator=torch.Generator().manual_seed(9))
    stats = {}
    for block_rows in (5, 1000):
        monkeypatch.setattr(statistics, "BLOCK_ROWS", block_rows)
        reducer = DecompositionReducer(loaded, check_prompts(loaded, tokens),
                                       bootstrap=Bootstrap() if bootstrap_on else NO_INTERVALS, **options)
        stream(loaded, tokens, [reducer], batch_size=3, progress=False)
        stats[block_rows] = reducer.stats
    for layer, blocked in stats[5].items():
        whole = stats[1000][layer]
        for name in ("xty_t", "xty_z", "row_t", "sum_y", "sum_y2", "n_sequences"):
            torch.testing.assert_close(getattr(blocked, name), getattr(whole, name), rtol=1e-12, atol=1e-9)


def _direct_statistics(scores, design):
    """The statistics of one group (every sequence) by explicit float64 sums over the analysed pairs:
    t = s - s[i, i], z = logsumexp of t over the key set (masked cells -inf), log A = t - z."""
    s = scores[:, :, design.query_start:design.query_stop].to(torch.float64)
    s = s.masked_fill(~design.key_set, -torch.inf)
    t, z = self_referenced_scores(s, design.query_start)
    t = t.masked_fill(~design.analysed, 0.0)
    log_a = (t - z[..., None]).masked_fill(~design.analysed, 0.0)
    rows = design.query - design.query_start
    xty_t = torch.zeros(s.shape[1], design.n_features, dtype=torch.float64)
    for a in range(4):
        xty_t.index_add_(1, design.columns[:, a], t.sum(0)[:, rows, design.key])
    return {"xty_t": xty_t, "xty_z": z.sum(0) @ design.row_features, "row_t": t.sum((0, -1)),
            "sum_y": log_a.sum((0, 2, 3)), "sum_y2": (log_a ** 2).sum((0, 2, 3))}


@pytest.mark.parametrize("fill", [-torch.inf, torch.finfo(torch.float32).min])
@pytest.mark.parametrize("keys,window,query_range", [("all", None, (0, 30)), ("no-bos", None, (3, 27)),
                                                     ("all", 7, (0, 30))])
@pytest.mark.parametrize("overflow", [False, True])
def test_reduced_statistics_equal_explicit_sums(monkeypatch, fill, keys, window, query_range, overflow):
    """The streamed reduction (blocks of rows, the mask's cells zeroed before exp, exp's overflow
    falling back to logsumexp) against explicit float64 sums over the analysed pairs, whichever value
    writes the mask (-inf, or finfo.min as a bridge outside compatibility mode does), with a
    visible score 800 above its diagonal (exp(t) overflows) or without."""
    from lens_position.analyses.engine import statistics
    from lens_position.analyses.engine.statistics import HeadStatistics, reduce_scores

    monkeypatch.setattr(statistics, "BLOCK_ROWS", 8)
    length = 30
    design = PairDesign.build(length, window, *query_range, keys, PositionBins())
    gen = torch.Generator().manual_seed(3)
    scores = torch.randn(3, 2, length, length, generator=gen) * 4
    i, j = torch.meshgrid(torch.arange(length), torch.arange(length), indexing="ij")
    shown = (j <= i) & ((j > i - window) if window else True)
    scores = scores.masked_fill(~shown, fill)
    if overflow:
        scores[1, 0, 20, 18] = scores[1, 0, 20, 20] + 800.0
    stats = HeadStatistics.zeros(2, design.n_features, query_range[1] - query_range[0], n_groups=2)
    reduce_scores(scores, design, torch.zeros(3, dtype=torch.long), stats)
    direct = _direct_statistics(scores, design)
    assert torch.isfinite(stats.sum_y).all()
    for name, value in direct.items():
        torch.testing.assert_close(getattr(stats, name)[0], value, rtol=1e-12, atol=1e-9)
    assert torch.equal(stats.n_sequences, torch.tensor([3.0, 0.0], dtype=torch.float64))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), fill=st.sampled_from(["-inf", "finfo.min", "finite", "nan", "+inf"]),
       keys=st.sampled_from(["all", "no-bos"]), window=st.sampled_from([None, 5]), block_rows=st.integers(3, 40))
def test_the_masked_cells_values_are_never_read_and_t_only_targets_sum_t_alone(seed, fill, keys, window, block_rows):
    """The design's key set decides which cells count, whatever a masked cell holds (the model's -inf or
    finfo.min, or the finite, NaN or infinite values a derived score has there): every statistic is the
    same. A ``t_only`` target, read in the same pass as a full one, gets the same ``X't`` and leaves
    the rest alone."""
    from lens_position.analyses.engine import statistics
    from lens_position.analyses.engine.statistics import HeadStatistics, Target, reduce_score_sets, reduce_scores

    length = 24
    design = PairDesign.build(length, window, 0, length, keys, PositionBins())
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(3, 2, length, length, generator=gen, dtype=torch.float64) * 4
    i, j = torch.meshgrid(torch.arange(length), torch.arange(length), indexing="ij")
    shown = (j <= i) & ((j > i - window) if window else True)
    masked = scores.masked_fill(~shown, -torch.inf)
    other = {"-inf": masked, "finfo.min": scores.masked_fill(~shown, torch.finfo(torch.float64).min),
             "finite": scores * 1e3, "nan": scores.masked_fill(~shown, torch.nan),
             "+inf": scores.masked_fill(~shown, torch.inf)}[fill]
    other = torch.where(shown, masked, other)
    groups = torch.tensor([0, 1, 0])

    def zeros() -> HeadStatistics:
        return HeadStatistics.zeros(2, design.n_features, length, n_groups=2)

    expected = zeros()
    reduce_scores(masked, design, groups, expected)

    class Sets:  # the full reduction of one tensor and the t-sums of the other, block by block
        shape, device = tuple(other.shape), other.device

        def blocks(self, heads, queries, keys):
            yield 0, other[:, heads, queries, keys]
            yield 1, masked[:, heads, queries, keys]

    full, t_only = zeros(), HeadStatistics.zeros(2, design.n_features, length, n_groups=2, t_only=True)
    with pytest.MonkeyPatch.context() as patch:  # blocks of rows that need not divide the length
        patch.setattr(statistics, "BLOCK_ROWS", block_rows)
        reduce_score_sets(Sets(), design, groups, [Target(full), Target(t_only, t_only=True)])
    for name in ("xty_t", "xty_z", "row_t", "sum_y", "sum_y2", "n_sequences"):
        torch.testing.assert_close(getattr(full, name), getattr(expected, name), rtol=1e-12, atol=1e-9)
    for name in ("xty_t", "n_sequences"):
        torch.testing.assert_close(getattr(t_only, name), getattr(expected, name), rtol=1e-12, atol=1e-9)
    assert t_only.xty_z.numel() == t_only.row_t.numel() == 0 and not t_only.sum_y.any() and not t_only.sum_y2.any()


def test_shifted_logcumsumexp_equals_torchs():
    """With ``shifted`` (the caller subtracted an upper bound of every row) no maximum is taken:
    float64 round-off against torch.logcumsumexp on ordinary rows, torch's own values where the
    prefix underflows (the first values more than 700 below the bound) or a row holds NaN."""
    from lens_position.analyses.engine.kernels import fast_logcumsumexp

    gen = torch.Generator().manual_seed(11)
    x = torch.randn(40, 3, 64, generator=gen, dtype=torch.float64) * 20
    x = x - x.amax(-1, keepdim=True) - torch.rand(40, 3, 1, generator=gen, dtype=torch.float64) * 30
    x[0, 0, :3] = -2000.0
    x[1, 2] -= 800.0  # the whole row far below the bound
    x[2, 1, 7] = float("nan")
    fast, exact = fast_logcumsumexp(x, shifted=True), torch.logcumsumexp(x, dim=-1)
    assert torch.equal(fast.isnan(), exact.isnan())
    finite = exact.isfinite()
    torch.testing.assert_close(fast[finite], exact[finite], rtol=1e-13, atol=1e-13)
    for row in ((0, 0), (1, 2), (2, 1)):
        assert torch.equal(fast[row].nan_to_num(), exact[row].nan_to_num())


def test_one_sequence_says_why_its_held_out_numbers_are_not_defined():
    """Held-out fits need two halves of the sequences: N = 1 prints the reason beside each headline."""
    loaded = random_model(n_layers=2, attn_types=("global", "global"))
    result = decompose(loaded, torch.randint(0, 50, (1, 12), generator=torch.Generator().manual_seed(0)),
                       progress=False)
    assert result.layers["R_rf_heldout"].isna().all()
    text = repr(result)
    assert text.count("needs N >= 2 sequences, this ran on N = 1") == 3 and "not defined" in text
