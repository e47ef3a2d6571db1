"""Position probes: the streamed ridge equals an explicit one, and it finds position
exactly where a model writes it and nowhere else."""

import numpy as np
import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from lens_position.analyses.probes import position_probe
from lens_position.core.columns import display_order
from lens_position.core.inputs import check_prompts
from lens_position.ground.errors import BadInputError
from lens_position.models.toy import random_model


def learned_position_model(length: int) -> HookedTransformer:
    """Absolute position embedding whose first direction is log(i + 1): linearly readable."""
    cfg = HookedTransformerConfig(n_layers=1, d_model=8, d_head=4, n_heads=2, n_ctx=length, d_vocab=30,
                                  attn_only=True, normalization_type=None, positional_embedding_type="standard",
                                  seed=0)
    model = HookedTransformer(cfg)
    with torch.no_grad():
        model.pos_embed.W_pos.zero_()
        model.embed.W_E[:, 0] = 0.0  # token content lives in the other directions
        model.pos_embed.W_pos[:, 0] = torch.log1p(torch.arange(length, dtype=torch.float32))
    return model


def test_probe_reads_position_where_the_model_writes_it():
    tokens = torch.randint(0, 30, (8, 40), generator=torch.Generator().manual_seed(0))
    result = position_probe(learned_position_model(40), tokens, ridge=1e-3, progress=False).layers
    assert result.r2_heldout[0] > 0.999
    assert result.r2_shuffled[0] < 0.05


def test_rope_embeddings_carry_no_position():
    loaded = random_model(n_layers=2, d_vocab=50)
    tokens = torch.randint(0, 50, (12, 48), generator=torch.Generator().manual_seed(1))
    layer0 = position_probe(loaded, tokens, layers=[0], progress=False).layers.iloc[0]
    assert layer0.r2_heldout < 0.05 and layer0.r2_shuffled < 0.05
    assert layer0.n_train == layer0.n_test == 6 * 47


def test_streamed_probe_equals_explicit_ridge():
    loaded = random_model(n_layers=2, d_vocab=50)
    tokens = torch.randint(0, 50, (10, 32), generator=torch.Generator().manual_seed(2))
    ridge = 0.03
    result = position_probe(loaded, tokens, ridge=ridge, seed=5, batch_size=3, progress=False)
    test_rows = result.provenance["options"]["test_sequences"]
    is_test = np.isin(np.arange(10), test_rows)
    _, cache = loaded.model.run_with_cache(tokens)
    label = np.log1p(np.arange(1, 32))
    for layer in (0, 1):
        x = cache[f"blocks.{layer}.hook_resid_pre"][:, 1:].double().numpy()
        train_x, test_x = x[~is_test].reshape(-1, x.shape[-1]), x[is_test].reshape(-1, x.shape[-1])
        train_y, test_y = np.tile(label, (~is_test).sum()), np.tile(label, is_test.sum())
        mean, std = train_x.mean(0), train_x.std(0)
        standard = (train_x - mean) / std
        beta = np.linalg.solve(standard.T @ standard + ridge * len(train_y) * np.eye(x.shape[-1]),
                               standard.T @ (train_y - train_y.mean()))
        predicted = train_y.mean() + ((test_x - mean) / std) @ beta
        r2 = 1 - ((test_y - predicted) ** 2).sum() / ((test_y - test_y.mean()) ** 2).sum()
        assert result.layers.r2_heldout[layer] == pytest.approx(r2, abs=1e-8)


def test_probe_errors():
    loaded = random_model()
    with pytest.raises(BadInputError, match="3 when"):
        position_probe(loaded, torch.arange(2 * 16).view(2, 16) % 50, progress=False)
    with pytest.raises(BadInputError, match="at least 2"):
        position_probe(loaded, torch.arange(1 * 16).view(1, 16) % 50, ridge=1.0, progress=False)
    with pytest.raises(BadInputError, match="layers"):
        position_probe(loaded, torch.arange(4 * 16).view(4, 16) % 50, layers=[7], progress=False)


def test_penalty_is_chosen_within_the_training_sequences():
    """The default penalty comes from the grid by cross-validation on training folds only:
    changing the held-out sequences' tokens cannot change it."""
    from lens_position.analyses.probes import RIDGE_GRID

    loaded = random_model(n_layers=1, d_vocab=50)
    tokens = torch.randint(0, 50, (12, 32), generator=torch.Generator().manual_seed(3))
    first = position_probe(loaded, tokens, layers=[0], seed=1, progress=False)
    test_rows = first.provenance["options"]["test_sequences"]
    altered = tokens.clone()
    altered[test_rows] = torch.randint(0, 50, (len(test_rows), 32), generator=torch.Generator().manual_seed(4))
    second = position_probe(loaded, altered, layers=[0], seed=1, progress=False)
    assert first.layers.ridge[0] in RIDGE_GRID
    assert second.layers.ridge[0] == first.layers.ridge[0]
    assert second.layers.r2_train[0] == pytest.approx(first.layers.r2_train[0], abs=1e-12)


def _explicit_fit(x, label, rows, weight, ridge):
    """The standardised ridge probe fitted explicitly on the sequences ``rows`` of ``x`` (each with
    its ``weight``): ``(mean, std, mean_y, beta)``."""
    train_x = x[rows].reshape(-1, x.shape[-1])
    train_y = np.tile(label, len(rows))
    row_weight = np.repeat(weight, len(label))
    total = row_weight.sum()
    mean = row_weight @ train_x / total
    std = np.sqrt(row_weight @ (train_x - mean) ** 2 / total)
    standard = (train_x - mean) / std
    mean_y = row_weight @ train_y / total
    beta = np.linalg.solve(standard.T @ (row_weight[:, None] * standard) + ridge * total * np.eye(x.shape[-1]),
                           standard.T @ (row_weight * (train_y - mean_y)))
    return mean, std, mean_y, beta


def _explicit_interval(loaded, tokens, result, layer, ridge, n_resamples=200):
    """The held-out R² interval, explicitly: held-out and training sequences grouped into units
    (sequence k of each side in unit k % units); the all-data probe's squared errors per held-out
    unit, bootstrapped over those units (widened like every bootstrap here); the jackknife over
    training units, each leaving one unit out and refitting the probe, scored on all held-out
    rows; the bootstrap's spread stretched about the estimate to add the jackknife variance."""
    from lens_position.analyses.probes import PROBE_INTERVAL_GROUPS
    from lens_position.core.intervals import percentile_interval, resample_counts, small_sample_widening

    test_rows = sorted(result.provenance["options"]["test_sequences"])
    train_rows = [n for n in range(len(tokens)) if n not in set(test_rows)]
    _, cache = loaded.model.run_with_cache(tokens)
    x = cache[f"blocks.{layer}.hook_resid_pre"][:, 1:].double().numpy()
    label = np.log1p(np.arange(1, x.shape[1] + 1))
    test_units, train_units = min(len(test_rows), PROBE_INTERVAL_GROUPS), min(len(train_rows), PROBE_INTERVAL_GROUPS)

    def errors(fit):
        mean, std, mean_y, beta = fit
        return np.array([((label - mean_y - ((x[n] - mean) / std) @ beta) ** 2).sum() for n in test_rows])

    total = len(test_rows) * ((label - label.mean()) ** 2).sum()
    fitted = errors(_explicit_fit(x, label, train_rows, np.ones(len(train_rows)), ridge))
    estimate = 1 - fitted.sum() / total
    unit_errors = np.array([fitted[u::test_units].sum() for u in range(test_units)])
    unit_sequences = np.array([len(fitted[u::test_units]) for u in range(test_units)], dtype=float)
    counts = resample_counts(test_units, n_resamples).numpy().astype(float)
    n_b = counts @ unit_sequences
    total_b = n_b * (label ** 2).sum() - (n_b * label.sum()) ** 2 / (n_b * len(label))
    replicates = small_sample_widening(estimate, 1 - counts @ unit_errors / total_b, test_units)
    jackknife = np.array([1 - errors(_explicit_fit(x, label, train_rows, (np.arange(len(train_rows)) % train_units
                                                                         != u).astype(float), ridge)).sum() / total
                          for u in range(train_units)])
    refit_variance = (train_units - 1) / train_units * ((jackknife - jackknife.mean()) ** 2).sum()
    stretch = np.sqrt(1 + refit_variance / np.var(replicates))
    return estimate, percentile_interval(estimate + (replicates - estimate) * stretch)


@pytest.mark.parametrize("n_sequences, length", [(12, 20), (12, 48), (40, 20)],
                         ids=["rows kept", "rows folded into moments", "several sequences per unit"])
def test_heldout_r2_interval_holds_the_heldout_bootstrap_and_the_refit_jackknife(n_sequences, length):
    """The interval equals an explicit computation: the bootstrap over held-out units of the
    fitted probe's errors, stretched by the jackknife variance of a probe refitted without each
    training unit in turn (same draws, widening and units)."""
    from lens_position.analyses.probes import PROBE_INTERVAL_GROUPS

    loaded = random_model(n_layers=1, d_vocab=50)
    tokens = torch.randint(0, 50, (n_sequences, length), generator=torch.Generator().manual_seed(6))
    ridge = 0.05
    result = position_probe(loaded, tokens, ridge=ridge, seed=2, batch_size=5, progress=False)
    estimate, (lo, hi) = _explicit_interval(loaded, tokens, result, 0, ridge)
    intervals = result.provenance["options"]["intervals"]
    assert intervals["units"] == min(n_sequences // 2, PROBE_INTERVAL_GROUPS) == intervals["training_units"]
    row = result.layers.iloc[0]
    assert row.r2_heldout == pytest.approx(estimate, abs=1e-9)
    assert (row.r2_heldout_lo, row.r2_heldout_hi) == (pytest.approx(lo, abs=1e-8), pytest.approx(hi, abs=1e-8))
    assert row.r2_shuffled_lo < row.r2_shuffled_hi


def test_the_refit_widens_the_heldout_r2_interval():
    """The refit's own variability is part of the interval: on a probe whose weights depend on
    which training sequences it sees (random model, few sequences), the interval is wider than
    the bootstrap of the held-out sequences with the fitted weights kept."""
    from lens_position.analyses.probes import ProbeReducer, _fit
    from lens_position.core.intervals import percentile_interval, resample_counts, small_sample_widening
    from lens_position.core.stream import stream

    loaded = random_model(n_layers=1, d_vocab=50)
    tokens = torch.randint(0, 50, (16, 24), generator=torch.Generator().manual_seed(9))
    reducer = ProbeReducer(loaded, check_prompts(loaded, tokens), ridge=0.05, seed=1)
    stream(loaded, tokens, [reducer], batch_size=8, progress=False)
    row = reducer.result().layers.iloc[0]
    test, fold_a, fold_b = reducer.moments[0]
    ((w, c),), = _fit(fold_a + fold_b, (0,), [0.05])
    units, reference = reducer.units[0], reducer.reference[0]
    errors = np.array([float(u.errors(reference, w[None], c[None])[0]) for u in units])
    sums = np.array([u.label_sums() for u in units])
    counts = resample_counts(len(units), 200).numpy().astype(float)
    n_b, sum_y_b, sum_y2_b = (counts @ sums[:, k] for k in range(3))
    fixed = small_sample_widening(row.r2_heldout, 1 - counts @ errors / (sum_y2_b - sum_y_b ** 2 / n_b), len(units))
    fixed_lo, fixed_hi = percentile_interval(fixed)
    assert row.r2_heldout_hi - row.r2_heldout_lo > 1.2 * (fixed_hi - fixed_lo)


def test_probe_of_a_written_position_has_a_tight_interval_near_one_and_provenance_says_how():
    tokens = torch.randint(0, 30, (8, 40), generator=torch.Generator().manual_seed(0))
    result = position_probe(learned_position_model(40), tokens, ridge=1e-3, progress=False)
    row = result.layers.iloc[0]
    assert 0.999 < row.r2_heldout_lo <= row.r2_heldout <= row.r2_heldout_hi <= 1.0
    assert row.r2_shuffled_lo < 0.05
    intervals = result.provenance["options"]["intervals"]
    assert intervals["level"] == 0.95 and intervals["n_resamples"] == 200
    assert "sequence" in intervals["method"] and intervals["units"] == 4 == intervals["training_units"]
    assert list(result.layers.columns) == display_order([
        "layer", "r2_heldout", "r2_train", "r2_shuffled", "ridge", "n_train", "n_test", "r2_heldout_lo",
        "r2_heldout_hi", "r2_shuffled_lo", "r2_shuffled_hi"])


def test_probe_without_intervals_keeps_no_rows_and_reports_nan():
    from lens_position.analyses.probes import ProbeReducer
    from lens_position.core.intervals import NO_INTERVALS
    from lens_position.core.stream import stream

    loaded = random_model(n_layers=1, d_vocab=50)
    tokens = torch.randint(0, 50, (8, 20), generator=torch.Generator().manual_seed(7))
    reducer = ProbeReducer(loaded, check_prompts(loaded, tokens), ridge=0.1, bootstrap=NO_INTERVALS)
    stream(loaded, tokens, [reducer], batch_size=4, progress=False)
    assert reducer.units == {0: []} and reducer.train_units == {0: []}
    row = reducer.result().layers.iloc[0]
    assert np.isnan([row.r2_heldout_lo, row.r2_heldout_hi, row.r2_shuffled_lo, row.r2_shuffled_hi]).all()


@pytest.mark.parametrize("with_intervals", [True, False])
def test_probe_fed_only_its_training_rows_refuses_rather_than_report_nan(with_intervals):
    """Rows are handed to the reducer explicitly; if no held-out row ever arrives, the held-out
    R² would be 0/0: result() says so instead (with intervals the units hold the held-out rows,
    without them the held-out moments do)."""
    from lens_position.analyses.probes import ProbeReducer
    from lens_position.core.intervals import NO_INTERVALS, Bootstrap

    loaded = random_model(n_layers=1, d_vocab=50)
    tokens = torch.randint(0, 50, (8, 20), generator=torch.Generator().manual_seed(7))
    reducer = ProbeReducer(loaded, check_prompts(loaded, tokens), ridge=0.1,
                           bootstrap=Bootstrap() if with_intervals else NO_INTERVALS)
    _, cache = loaded.model.run_with_cache(tokens, names_filter=reducer.hook_names[0])
    train = (reducer.split > 0).nonzero().squeeze(1)
    reducer.update(reducer.hook_names[0], cache[reducer.hook_names[0]][train], train)
    with pytest.raises(BadInputError, match="no test rows"):
        reducer.result()
