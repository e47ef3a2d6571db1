"""Position probes: the streamed ridge equals an explicit one, and it finds position
exactly where a model writes it and nowhere else."""

import numpy as np
import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from lens_position.errors import BadInputError
from lens_position.probes import position_probe
from lens_position.toy import random_model


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
        position_probe(loaded, torch.zeros(2, 16, dtype=torch.long), progress=False)
    with pytest.raises(BadInputError, match="at least 2"):
        position_probe(loaded, torch.zeros(1, 16, dtype=torch.long), ridge=1.0, progress=False)
    with pytest.raises(BadInputError, match="layers"):
        position_probe(loaded, torch.zeros(4, 16, dtype=torch.long), layers=[7], progress=False)


def test_penalty_is_chosen_within_the_training_sequences():
    """The default penalty comes from the grid by cross-validation on training folds only:
    changing the held-out sequences' tokens cannot change it."""
    from lens_position.probes import RIDGE_GRID

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


def _explicit_heldout_errors(loaded, tokens, result, layer, ridge):
    """Per held-out sequence: rows, sum y, sum y², and the squared errors of the true and the
    shuffled probe (both fitted explicitly on the training sequences)."""
    test_rows = result.provenance["options"]["test_sequences"]
    is_test = np.isin(np.arange(len(tokens)), test_rows)
    _, cache = loaded.model.run_with_cache(tokens)
    x = cache[f"blocks.{layer}.hook_resid_pre"][:, 1:].double().numpy()
    length = x.shape[1]
    label = np.log1p(np.arange(1, length + 1))
    train_x = x[~is_test].reshape(-1, x.shape[-1])
    mean, std = train_x.mean(0), train_x.std(0)
    standard = (train_x - mean) / std
    train_y = np.tile(label, (~is_test).sum())
    beta = np.linalg.solve(standard.T @ standard + ridge * len(train_y) * np.eye(x.shape[-1]),
                           standard.T @ (train_y - train_y.mean()))
    errors = [((label - train_y.mean() - ((x[n] - mean) / std) @ beta) ** 2).sum() for n in sorted(test_rows)]
    return np.array(errors), label


@pytest.mark.parametrize("n_sequences, length", [(12, 20), (12, 48), (40, 20)],
                         ids=["rows kept", "rows folded into moments", "several sequences per unit"])
def test_heldout_r2_interval_is_the_bootstrap_of_the_heldout_sequences_errors(n_sequences, length):
    """The interval equals an explicit bootstrap over units of held-out sequences of the explicit
    ridge probe's squared errors (weights fixed), with the same draws and widening."""
    from lens_position.intervals import percentile_interval, resample_counts, small_sample_widening
    from lens_position.probes import PROBE_INTERVAL_GROUPS

    loaded = random_model(n_layers=1, d_vocab=50)
    tokens = torch.randint(0, 50, (n_sequences, length), generator=torch.Generator().manual_seed(6))
    ridge = 0.05
    result = position_probe(loaded, tokens, ridge=ridge, seed=2, batch_size=5, progress=False)
    errors, label = _explicit_heldout_errors(loaded, tokens, result, 0, ridge)
    n_units = min(len(errors), PROBE_INTERVAL_GROUPS)
    assert result.provenance["options"]["intervals"]["units"] == n_units
    unit_errors = np.array([errors[u::n_units].sum() for u in range(n_units)])
    unit_sequences = np.array([len(errors[u::n_units]) for u in range(n_units)], dtype=float)
    counts = resample_counts(n_units, 200).numpy().astype(float)
    n_b = counts @ unit_sequences
    total = n_b * (label ** 2).sum() - (n_b * label.sum()) ** 2 / (n_b * len(label))
    replicates = 1 - counts @ unit_errors / total
    row = result.layers.iloc[0]
    assert row.r2_heldout == pytest.approx(1 - errors.sum() / (len(errors) * ((label - label.mean()) ** 2).sum()),
                                           abs=1e-9)
    lo, hi = percentile_interval(small_sample_widening(row.r2_heldout, replicates, n_units))
    assert (row.r2_heldout_lo, row.r2_heldout_hi) == (pytest.approx(lo, abs=1e-8), pytest.approx(hi, abs=1e-8))
    assert row.r2_shuffled_lo <= row.r2_shuffled <= row.r2_shuffled_hi


def test_probe_of_a_written_position_has_a_tight_interval_near_one_and_provenance_says_how():
    tokens = torch.randint(0, 30, (8, 40), generator=torch.Generator().manual_seed(0))
    result = position_probe(learned_position_model(40), tokens, ridge=1e-3, progress=False)
    row = result.layers.iloc[0]
    assert 0.999 < row.r2_heldout_lo <= row.r2_heldout <= row.r2_heldout_hi <= 1.0
    assert row.r2_shuffled_lo < 0.05
    intervals = result.provenance["options"]["intervals"]
    assert intervals["level"] == 0.95 and intervals["n_resamples"] == 200
    assert "held-out sequence" in intervals["method"] and intervals["units"] == 4
    assert list(result.layers.columns) == ["layer", "r2_heldout", "r2_train", "r2_shuffled", "ridge", "n_train",
                                           "n_test", "r2_heldout_lo", "r2_heldout_hi", "r2_shuffled_lo",
                                           "r2_shuffled_hi"]


def test_probe_without_intervals_keeps_no_heldout_rows_and_reports_nan():
    from lens_position.intervals import NO_INTERVALS
    from lens_position.probes import ProbeReducer
    from lens_position.stream import stream

    loaded = random_model(n_layers=1, d_vocab=50)
    tokens = torch.randint(0, 50, (8, 20), generator=torch.Generator().manual_seed(7))
    reducer = ProbeReducer(loaded, tokens, ridge=0.1, bootstrap=NO_INTERVALS)
    stream(loaded, tokens, [reducer], batch_size=4, progress=False)
    assert reducer.units == {0: []}
    row = reducer.result().layers.iloc[0]
    assert np.isnan([row.r2_heldout_lo, row.r2_heldout_hi, row.r2_shuffled_lo, row.r2_shuffled_hi]).all()
