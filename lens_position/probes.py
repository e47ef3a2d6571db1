"""Position probes: how well a linear read-out of the residual stream recovers position.

After Haviv et al. (2022): per layer ``l``, a ridge regression from ``resid_pre[l]`` at
position ``i`` to ``log(i + 1)``, scored by R² on held-out sequences. A second view of
where absolute position lives, independent of the attention decomposition: a RoPE model
puts no position into its embeddings, so layer 0 should score near 0 (content carries no
position within random windows of text) and deeper layers show what the network has
built.

Control: the same probe trained on labels shuffled within each training sequence
(``log(pi(i) + 1)`` for a seeded permutation ``pi``), scored on the true test labels. Its
R² is the floor a probe reaches without real positional information (about 0 or below).

Everything is streamed: the hook reduces each batch to ``X'X``, ``X'y``, sums and sums of
squares (float64, centred on the first batch's mean to avoid cancellation), so memory is
``O(layers x d_model^2)`` whatever the number of sequences. Features are standardised with
the training statistics; the ridge penalty is ``ridge * n_train * |w|^2`` on the
standardised weights, so ``ridge`` compares directly with the eigenvalues of the features'
correlation matrix (1 = an average direction). The intercept is not penalised. By default
``ridge`` is chosen per layer from ``RIDGE_GRID`` by two-fold cross-validation *within* the
training sequences (the held-out sequences are never used to choose it); the shuffled
control uses the same penalty.

**Intervals.** ``r2_heldout`` and ``r2_shuffled`` get a bootstrap interval over whole
held-out sequences (:mod:`lens_position.intervals`), with no extra forward pass. Once the
probe's weights ``w, c`` are known, a held-out sequence enters R² only through its error
sum ``sum_i (y_i - c - x_i·w)^2`` and its label sums, so the reducer keeps every held-out
sequence's *rows* (``resid_pre`` as the model produced it, in float32, exact for a float32,
bfloat16 or float16 model) and evaluates the fitted probes on them after the stream; a
replicate re-weights those per-sequence sums. The held-out sequences are grouped into at
most ``PROBE_INTERVAL_GROUPS`` units (each its own unit up to that many; sequence ``k`` of
the held-out half in unit ``k % units`` beyond), and a unit whose rows reach ``d_model``
folds them into its float64 moments (a ``d_model x d_model`` Gram matrix). Memory for the
intervals is therefore ``4 x d_model`` bytes per held-out row and probed layer while no unit
has folded, and never more than ``units x 12 x d_model^2`` bytes per probed layer (a Gram
matrix and up to ``d_model`` float32 rows per unit), whatever N: about 70 MB for
SmolLM2-135M at the reproduction's sizes (8 held-out sequences of 127 rows, d_model 576,
30 layers; the probe's own moments take 80 MB), at most 32 MB per layer. The interval is
conditional on the fitted probe:
it resamples the held-out sequences, not the training ones (refitting per replicate would
need a Gram matrix per training unit), so it understates the spread of a refit on other
prompts: on SmolLM2-135M, over 4 disjoint prompt sets, the held-out R² varied 1.3 to 1.7
times as much as the interval predicts at layers 1, 5 and 10, and 3.0 times at layer 15
(where the cross-validated penalty ranged from 0.1 to 10).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from transformer_lens import HookedTransformer

from lens_position import provenance
from lens_position.checks import check_count, check_layers, check_query_range, check_seed
from lens_position.errors import BadInputError
from lens_position.inputs import checked_prompts
from lens_position.intervals import Bootstrap, percentile_interval, resample_counts, small_sample_widening
from lens_position.models.spec import LoadedModel, as_loaded
from lens_position.results import SavedResult
from lens_position.stream import stream

RIDGE_GRID = tuple(float(x) for x in 10.0 ** np.arange(-4, 3.01, 0.5))


# Sequences a held-out probe needs when its penalty is chosen by cross-validation: one test
# half and two training folds.
PROBE_MIN_N = 3
# The held-out sequences are resampled as at most this many units (module docstring: memory).
PROBE_INTERVAL_GROUPS = 8

@dataclass
class _Moments:
    """Streaming moments of (x - reference, y) for one layer and one split."""

    n: int
    sum_x: Float[torch.Tensor, "d"]
    gram: Float[torch.Tensor, "d d"]
    xty: Float[torch.Tensor, "target d"]  # one row per target (true, shuffled)
    sum_y: Float[torch.Tensor, "target"]
    sum_y2: Float[torch.Tensor, "target"]

    def __add__(self, other: "_Moments") -> "_Moments":
        return _Moments(self.n + other.n, self.sum_x + other.sum_x, self.gram + other.gram,
                        self.xty + other.xty, self.sum_y + other.sum_y, self.sum_y2 + other.sum_y2)

    @classmethod
    def zeros(cls, d: int, n_targets: int) -> "_Moments":
        f = lambda *shape: torch.zeros(*shape, dtype=torch.float64)  # noqa: E731
        return cls(0, f(d), f(d, d), f(n_targets, d), f(n_targets), f(n_targets))

    def add(self, x: Float[torch.Tensor, "row d"], y: Float[torch.Tensor, "row target"]) -> None:
        self.n += x.shape[0]
        self.sum_x += x.sum(0)
        self.gram += x.T @ x
        self.xty += y.T @ x
        self.sum_y += y.sum(0)
        self.sum_y2 += (y * y).sum(0)


class _HeldoutUnit:
    """One resampling unit of held-out sequences: their rows ``x`` (uncentred, float32 unless
    the model is float64) and true labels until they reach ``d_model`` rows, then their
    float64 moments (centred on the layer's reference); enough to evaluate any fitted probe on
    them once its weights are known (module docstring)."""

    def __init__(self, d_model: int) -> None:
        self.d_model = d_model
        self.rows: list[torch.Tensor] = []
        self.labels: list[torch.Tensor] = []
        self.n_rows = 0
        self.folded: _Moments | None = None

    def add(self, x: Float[torch.Tensor, "row d"], y: Float[torch.Tensor, "row"],
            reference: Float[torch.Tensor, "d"]) -> None:
        self.rows.append(x if x.dtype == torch.float64 else x.to(torch.float32))
        self.labels.append(y)
        self.n_rows += x.shape[0]
        if self.n_rows >= self.d_model:  # more rows would cost more than the float64 Gram matrix they fold into
            moments = _Moments.zeros(self.d_model, 1)
            moments.add(torch.cat(self.rows).to(torch.float64) - reference, torch.cat(self.labels)[:, None])
            self.folded = moments if self.folded is None else self.folded + moments
            self.rows, self.labels, self.n_rows = [], [], 0

    def sums(self, reference: Float[torch.Tensor, "d"], probes: Sequence[tuple[torch.Tensor, torch.Tensor]]
             ) -> tuple[float, float, float, list[float]]:
        """``(rows, sum y, sum y², [sum (y - c - x·w)² for each probe (w, c)])`` over this unit."""
        n, sum_y, sum_y2, errors = 0.0, 0.0, 0.0, [0.0] * len(probes)
        if self.rows:
            x = torch.cat(self.rows).to(torch.float64) - reference
            y = torch.cat(self.labels)
            n, sum_y, sum_y2 = float(len(y)), float(y.sum()), float((y * y).sum())
            for k, (w, c) in enumerate(probes):
                errors[k] += float(((y - c - x @ w) ** 2).sum())
        if self.folded is not None:
            m = self.folded
            n, sum_y, sum_y2 = n + m.n, sum_y + float(m.sum_y[0]), sum_y2 + float(m.sum_y2[0])
            for k, (w, c) in enumerate(probes):
                errors[k] += float(m.sum_y2[0] - 2 * (c * m.sum_y[0] + w @ m.xty[0]) + m.n * c * c
                                   + 2 * c * (w @ m.sum_x) + w @ m.gram @ w)
        return n, sum_y, sum_y2, errors


def _fit(train: _Moments, targets: Sequence[int], ridges: Sequence[float]
         ) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Ridge weights ``w`` and intercept ``c`` (prediction ``c + x @ w``) from training
    moments: per target in ``targets``, one pair per penalty in ``ridges``. The targets share
    the features, so one eigendecomposition serves every target and penalty."""
    n = train.n
    mean_x = train.sum_x / n
    cov = train.gram / n - torch.outer(mean_x, mean_x)
    std = cov.diagonal().clamp(min=0).sqrt()
    std = torch.where(std > 1e-12 * std.max().clamp(min=1e-300), std, torch.ones_like(std))
    eigenvalues, eigenvectors = torch.linalg.eigh(cov / torch.outer(std, std))
    out = []
    for target in targets:
        mean_y = train.sum_y[target] / n
        cxy = train.xty[target] / n - mean_x * mean_y
        projected = eigenvectors.T @ (cxy / std)
        fits = []
        for ridge in ridges:
            w = (eigenvectors @ (projected / (eigenvalues.clamp(min=0) + ridge))) / std
            fits.append((w, mean_y - mean_x @ w))
        out.append(fits)
    return out


def _choose_ridge(fold_a: _Moments, fold_b: _Moments, grid: Sequence[float]) -> float:
    """The penalty with the best mean R² across the two folds (fit on one, score the other)."""
    scores = np.zeros(len(grid))
    for fit_on, score_on in ((fold_a, fold_b), (fold_b, fold_a)):
        for k, (w, c) in enumerate(_fit(fit_on, (0,), grid)[0]):
            scores[k] += _r2(score_on, 0, w, c)
    return float(grid[int(np.argmax(scores))])


def _r2(test: _Moments, target: int, w: torch.Tensor, c: torch.Tensor) -> float:
    """R² of ``c + x @ w`` against the test labels ``target``."""
    n = test.n
    sse = (test.sum_y2[target] - 2 * (c * test.sum_y[target] + w @ test.xty[target])
           + n * c * c + 2 * c * (w @ test.sum_x) + w @ test.gram @ w)
    sst = test.sum_y2[target] - test.sum_y[target] ** 2 / n
    return float(1 - sse / sst)


@dataclass
class ProbeResult(SavedResult):
    """``layers``: one row per layer: ``r2_heldout`` (R² of log(i+1) on held-out sequences,
    at most 1), ``r2_train``, ``r2_shuffled`` (probe trained on shuffled positions, scored on
    true held-out positions), ``ridge`` (the penalty used), ``n_train``/``n_test`` (rows:
    sequences x positions), and the bootstrap intervals over held-out sequences
    ``r2_heldout_lo``/``_hi`` and ``r2_shuffled_lo``/``_hi`` (NaN when intervals are off or
    fewer than 2 sequences are held out; module docstring).
    ``provenance``: model, data, seed, options, and ``intervals`` (method, level, resamples,
    units, scope)."""

    layers: pd.DataFrame
    provenance: dict[str, Any]


class ProbeReducer:
    """The probe's streaming moments as a reducer for :func:`lens_position.stream.stream`:
    reads ``resid_pre`` of the probed layers and keeps, per layer, the moments of the test
    sequences and of the two training folds. Options as in :func:`position_probe`; call
    :meth:`result` after streaming."""

    def __init__(self, model: LoadedModel | HookedTransformer, prompts: Any, *,
                 layers: Sequence[int] | None = None, ridge: float | None = None, seed: int = 0,
                 positions: tuple[int, int | None] = (1, None), bootstrap: Bootstrap = Bootstrap()) -> None:
        self.loaded = as_loaded(model)
        hooked = self.loaded.model
        checked = checked_prompts(self.loaded, prompts, min_length=2)
        tokens, self.data = checked.tokens, checked.spec
        n_seq, length = tokens.shape
        if n_seq < (2 if ridge is not None else PROBE_MIN_N):
            raise BadInputError("a held-out probe needs at least 2 sequences, and 3 when the penalty is chosen "
                                "by cross-validation (ridge=None): pass more prompts or a fixed ridge")
        layers = check_layers(layers, hooked.cfg.n_layers)
        seed = check_seed(seed)
        start, stop = check_query_range((positions[0], length if positions[1] is None else positions[1]), length,
                                        "positions")
        if stop - start < 2:
            raise BadInputError(f"positions must cover at least 2 positions within 0..{length - 1}, got {positions}")
        self.layers, self.ridge, self.seed, self.start, self.stop = layers, ridge, seed, start, stop
        self.bootstrap = bootstrap

        generator = torch.Generator().manual_seed(seed)
        order = torch.randperm(n_seq, generator=generator)
        self.split = torch.zeros(n_seq, dtype=torch.long)  # 0: test, 1 and 2: the two training folds
        self.split[order[n_seq // 2:]] = 1 + torch.arange(n_seq - n_seq // 2) % 2
        pos = torch.arange(start, stop)
        self.label = torch.log1p(pos.to(torch.float64))
        self.shuffled = torch.stack([self.label[torch.randperm(len(pos), generator=generator)]
                                     for _ in range(n_seq)])
        self.d_model = hooked.cfg.d_model
        self.moments = {layer: [_Moments.zeros(self.d_model, 2) for _ in range(3)] for layer in layers}
        # held-out sequence k (in index order) belongs to resampling unit k % n_units
        test_rows = (self.split == 0).nonzero().squeeze(1)
        self.n_units = min(len(test_rows), PROBE_INTERVAL_GROUPS) if bootstrap.enabled else 0
        self.unit_of = torch.full((n_seq,), -1, dtype=torch.long)
        if self.n_units:
            self.unit_of[test_rows] = torch.arange(len(test_rows)) % self.n_units
        self.units = {layer: [_HeldoutUnit(self.d_model) for _ in range(self.n_units)] for layer in layers}
        self.reference: dict[int, torch.Tensor] = {}
        self.hook_names = tuple(f"blocks.{layer}.hook_resid_pre" for layer in layers)
        self._layer_of = dict(zip(self.hook_names, layers))

    def update(self, hook_name: str, resid: Float[torch.Tensor, "batch pos d_model"],
               rows: torch.Tensor) -> None:
        layer = self._layer_of[hook_name]
        raw = resid[:, self.start:self.stop].detach().cpu()
        x = raw.to(torch.float64)
        if layer not in self.reference:  # centre on the first batch's mean (avoids cancellation)
            self.reference[layer] = x.reshape(-1, self.d_model).mean(0)
        x = x - self.reference[layer]
        for unit, k in zip(self.unit_of[rows].tolist(), range(len(rows))):
            if unit >= 0:
                self.units[layer][unit].add(raw[k], self.label, self.reference[layer])
        for part, moment in enumerate(self.moments[layer]):
            chosen = (self.split[rows] == part).nonzero().squeeze(1)
            if len(chosen) == 0:
                continue
            y = torch.stack([self.label.expand(len(chosen), -1), self.shuffled[rows[chosen]]], dim=-1)
            moment.add(x[chosen].reshape(-1, self.d_model), y.reshape(-1, 2))

    def result(self) -> ProbeResult:
        """Fit the probes from the streamed moments (:class:`ProbeResult`)."""
        records = []
        for layer in self.layers:
            test, fold_a, fold_b = self.moments[layer]
            if test.n == 0 or fold_a.n == 0:
                raise BadInputError("the probe's prompts were not streamed (no test or training rows)")
            train = fold_a + fold_b
            penalty = self.ridge if self.ridge is not None else _choose_ridge(fold_a, fold_b, RIDGE_GRID)
            ((w, c),), ((w_shuffled, c_shuffled),) = _fit(train, (0, 1), [penalty])  # true and shuffled labels
            r2_heldout, r2_shuffled = _r2(test, 0, w, c), _r2(test, 0, w_shuffled, c_shuffled)
            bounds = self._intervals(layer, {"r2_heldout": (r2_heldout, w, c),
                                             "r2_shuffled": (r2_shuffled, w_shuffled, c_shuffled)})
            records.append({
                "layer": layer, "r2_heldout": r2_heldout, "r2_train": _r2(train, 0, w, c),
                "r2_shuffled": r2_shuffled, "ridge": penalty, "n_train": train.n, "n_test": test.n, **bounds,
            })
        ridge = self.ridge if self.ridge is not None else {"grid": list(RIDGE_GRID),
                                                           "chosen_by": "2-fold CV within training"}
        prov = provenance.collect(model=self.loaded.spec, data=self.data, seed=self.seed, layers=self.layers,
                                  ridge=ridge, positions=[self.start, self.stop], target="log(i+1)",
                                  features="resid_pre, standardised",
                                  split="half of the sequences held out (seeded)",
                                  test_sequences=(self.split == 0).nonzero().squeeze(1).tolist(),
                                  control="labels permuted within each training sequence",
                                  intervals={**self.bootstrap.to_dict("held-out sequence"), "units": self.n_units,
                                             "scope": "the held-out sequences are resampled with the fitted "
                                                      "probe's weights fixed (training sequences not resampled)",
                                             "columns": ["r2_heldout", "r2_shuffled"]})
        return ProbeResult(layers=pd.DataFrame(records), provenance=prov)

    def _intervals(self, layer: int, probes: dict[str, tuple[float, torch.Tensor, torch.Tensor]]
                   ) -> dict[str, float]:
        """``{name_lo, name_hi}`` for each fitted probe: the percentile interval of its held-out
        R² over bootstrap resamples of the held-out units (NaN without intervals or with
        fewer than 2 units)."""
        names = list(probes)
        out = {f"{name}_{side}": float("nan") for name in names for side in ("lo", "hi")}
        if self.n_units < 2:
            return out
        reference = self.reference[layer]
        sums = [unit.sums(reference, [(w, c) for _, w, c in probes.values()]) for unit in self.units[layer]]
        n, sum_y, sum_y2 = (np.array([s[k] for s in sums]) for k in range(3))
        errors = np.array([s[3] for s in sums])  # [unit, probe]
        counts = resample_counts(self.n_units, self.bootstrap.n_resamples, self.bootstrap.seed).numpy().astype(float)
        n_b, sum_y_b, sum_y2_b = counts @ n, counts @ sum_y, counts @ sum_y2
        total_b = sum_y2_b - sum_y_b ** 2 / n_b
        for k, name in enumerate(names):
            replicates = 1.0 - (counts @ errors[:, k]) / total_b
            replicates = small_sample_widening(probes[name][0], replicates, self.n_units)
            lo, hi = percentile_interval(replicates, self.bootstrap.level)
            out[f"{name}_lo"], out[f"{name}_hi"] = float(lo), float(hi)
        return out


def position_probe(
    model: LoadedModel | HookedTransformer,
    prompts: Any,
    *,
    layers: Sequence[int] | None = None,
    ridge: float | None = None,
    seed: int = 0,
    positions: tuple[int, int | None] = (1, None),
    batch_size: int = 8,
    bootstrap: Bootstrap = Bootstrap(),
    progress: bool = True,
) -> ProbeResult:
    """Held-out R² of a ridge probe from ``resid_pre[l]`` to ``log(i + 1)``, per layer.

    Args:
        model: a ``LoadedModel`` or ``HookedTransformer``.
        prompts: a ``PromptSet`` or tokens ``Int[Tensor, "N T"]`` (``N >= 2``).
        layers: layers whose ``resid_pre`` is probed (default all).
        ridge: penalty on the standardised weights (module docstring); None chooses it per
            layer from ``RIDGE_GRID`` by cross-validation within the training sequences.
        seed: which sequences are held out (half of them) and the label shuffle.
        positions: ``(start, stop)`` positions used as rows; the default leaves out
            position 0, whose activation is a fixed point of the model (claim C5 on the concepts page)
            rather than a position to read.
        batch_size: sequences per forward pass.
        bootstrap: the intervals of the held-out R² over held-out sequences (module
            docstring; ``NO_INTERVALS`` switches them off and keeps no held-out rows).
        progress: show a progress bar.

    To probe in the same pass as other statistics, stream a :class:`ProbeReducer` with them.
    """
    batch_size = check_count("batch_size", batch_size)
    prompts = checked_prompts(model, prompts, min_length=2)
    reducer = ProbeReducer(model, prompts, layers=layers, ridge=ridge, seed=seed, positions=positions,
                           bootstrap=bootstrap)
    stream(model, prompts, [reducer], batch_size=batch_size, progress=progress, desc="position probe")
    return reducer.result()
