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

**Intervals.** ``r2_heldout`` and ``r2_shuffled`` get a bootstrap interval
(:mod:`lens_position.core.intervals`) that holds both sources of their uncertainty, with no extra
forward pass: which sequences were held out, and which ones the probe was trained on.

- *Held-out sequences.* Once a probe's weights ``w, c`` are known, a held-out sequence enters
  R² only through its error sum ``sum_i (y_i - c - x_i·w)^2`` and its label sums, so the reducer
  keeps every held-out sequence's *rows* (``resid_pre`` as the model produced it, in float32,
  exact for a float32, bfloat16 or float16 model) and evaluates the fitted probes on them after
  the stream; a bootstrap replicate re-weights those per-sequence sums.
- *Training sequences.* The reducer keeps the training sequences' rows the same way (with
  both targets' labels), so the probe can be refitted without any of them. The delete-one-unit
  jackknife over the training units refits the probe once per unit left out (exactly, with the
  penalty chosen on all the training sequences; :func:`_refit`) and scores each refit on all
  the held-out rows; its variance is the refit's share of the uncertainty. The interval is
  the held-out bootstrap's, its spread stretched about the estimate so that its variance is
  the sum of both (the two sets of sequences are disjoint, so the two variances add).

A full bootstrap that refits the probe on every replicate's training units measures the same
spread (on SmolLM2-135M at layers 1, 15 and 29 its 95% intervals were 0.25, 0.18 and 0.47 wide,
against 0.23, 0.14 and 0.49 here), but costs one ``d³`` solve (or 20 to 80 conjugate-gradient
iterations) per replicate and layer: 0.7 to 2 s per layer on one thread, more than the whole
reproduction may spend on intervals. It also puts its replicates below the estimate, because a
probe trained on a resample sees fewer distinct sequences than the estimate's did. The
jackknife costs one Cholesky factorisation per training unit and layer (about 0.13 s per layer
on SmolLM2-135M).

The units: at most ``PROBE_INTERVAL_GROUPS`` on each side (each sequence its own unit up to
that many; sequence ``k`` of a side in unit ``k % units`` beyond), and a unit whose rows reach
``d_model`` folds them into its float64 moments (a ``d_model x d_model`` Gram matrix). Memory
for the intervals is therefore ``4 x d_model`` bytes per row and probed layer while no unit has
folded, and never more than ``2 x units x 12 x d_model^2`` bytes per probed layer, whatever N:
about 140 MB for SmolLM2-135M at the reproduction's sizes (16 sequences of 127 rows, d_model
576, 30 layers; the probe's own moments take 80 MB), at most 64 MB per layer. The penalty's own
choice (cross-validated on all the training sequences) is kept fixed by the refits.
Since the units hold every row, the held-out R² itself is their errors summed (no Gram matrix
of the held-out sequences is kept), and when each training unit lies in one fold (one sequence
per unit, as at the reproduction's sizes) the folds' moments are the sum of their units': each
row enters at most one Gram matrix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float

from lens_position.core.checks import check_count, check_layers, check_positive, check_query_range, check_seed
from lens_position.core.inputs import CheckedPrompts, Prompts, checked_prompts, require_checked
from lens_position.core.intervals import Bootstrap, percentile_interval, resample_counts, small_sample_widening
from lens_position.core.results import SavedResult, Table
from lens_position.core.stream import BATCH_SIZE, stream
from lens_position.core.summaries import Headline, row_estimate
from lens_position.ground import provenance
from lens_position.ground.errors import BadInputError
from lens_position.models.spec import LoadedModel, public

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

    def __add__(self, other: _Moments) -> _Moments:
        return _Moments(self.n + other.n, self.sum_x + other.sum_x, self.gram + other.gram,
                        self.xty + other.xty, self.sum_y + other.sum_y, self.sum_y2 + other.sum_y2)

    @classmethod
    def zeros(cls, d: int, n_targets: int) -> _Moments:
        f = lambda *shape: torch.zeros(*shape, dtype=torch.float64)  # noqa: E731
        return cls(0, f(d), f(d, d), f(n_targets, d), f(n_targets), f(n_targets))

    def add(self, x: Float[torch.Tensor, "row d"], y: Float[torch.Tensor, "row target"]) -> None:
        self.n += x.shape[0]
        self.sum_x += x.sum(0)
        self.gram += x.T @ x
        self.xty += y.T @ x
        self.sum_y += y.sum(0)
        self.sum_y2 += (y * y).sum(0)


class _Unit:
    """One resampling unit of sequences: their rows ``x`` (uncentred, float32 unless the model is
    float64) and labels (one column per target) until they reach ``d_model`` rows, then their
    float64 moments (centred on the layer's reference); enough to refit a probe on them or to
    evaluate any fitted probe on them after the stream (module docstring)."""

    def __init__(self, d_model: int, n_targets: int = 1) -> None:
        self.d_model, self.n_targets = d_model, n_targets
        self.rows: list[torch.Tensor] = []
        self.labels: list[torch.Tensor] = []
        self.n_rows = 0
        self.folded: _Moments | None = None

    def add(self, x: Float[torch.Tensor, "row d"], y: Float[torch.Tensor, "row target"],
            reference: Float[torch.Tensor, "d"]) -> None:
        self.rows.append(x if x.dtype == torch.float64 else x.to(torch.float32))
        self.labels.append(y)
        self.n_rows += x.shape[0]
        if self.n_rows >= self.d_model:  # more rows would cost more than the float64 Gram matrix they fold into
            moments = _Moments.zeros(self.d_model, self.n_targets)
            moments.add(torch.cat(self.rows).to(torch.float64) - reference, torch.cat(self.labels))
            self.folded = moments if self.folded is None else self.folded + moments
            self.rows, self.labels, self.n_rows = [], [], 0

    def centred_rows(self, reference: Float[torch.Tensor, "d"]
                     ) -> tuple[Float[torch.Tensor, "row d"], Float[torch.Tensor, "row target"]]:
        """The rows not yet folded, centred on ``reference`` (float64), and their labels."""
        if not self.rows:
            return torch.zeros(0, self.d_model, dtype=torch.float64), torch.zeros(0, self.n_targets,
                                                                                  dtype=torch.float64)
        return torch.cat(self.rows).to(torch.float64) - reference, torch.cat(self.labels)

    def moments(self, reference: Float[torch.Tensor, "d"]) -> _Moments:
        """Everything this unit holds as moments (the unfolded rows folded in, the unit unchanged)."""
        x, y = self.centred_rows(reference)
        moments = _Moments.zeros(self.d_model, self.n_targets)
        moments.add(x, y)
        return moments if self.folded is None else moments + self.folded

    def label_sums(self) -> tuple[float, float, float]:
        """``(rows, sum y, sum y²)`` of the first target (the true labels)."""
        y = torch.cat(self.labels)[:, 0] if self.labels else torch.zeros(0, dtype=torch.float64)
        n, sum_y, sum_y2 = float(len(y)), float(y.sum()), float((y * y).sum())
        if self.folded is not None:
            m = self.folded
            n, sum_y, sum_y2 = n + m.n, sum_y + float(m.sum_y[0]), sum_y2 + float(m.sum_y2[0])
        return n, sum_y, sum_y2

    def errors(self, reference: Float[torch.Tensor, "d"], w: Float[torch.Tensor, "probe d"],
               c: Float[torch.Tensor, "probe"]) -> Float[torch.Tensor, "probe"]:
        """``sum (y - c - x·w)²`` over this unit for each probe ``(w, c)``, against the true labels."""
        x, y = self.centred_rows(reference)
        out = ((y[:, :1] - c - x @ w.T) ** 2).sum(0)
        if self.folded is not None:
            m = self.folded
            out = out + (m.sum_y2[0] - 2 * (c * m.sum_y[0] + w @ m.xty[0]) + m.n * c * c
                         + 2 * c * (w @ m.sum_x) + ((w @ m.gram) * w).sum(-1))
        return out


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


def _solve(n: Float[torch.Tensor, "fit"], sum_x: Float[torch.Tensor, "fit d"], gram: Float[torch.Tensor, "fit d d"],
           xty: Float[torch.Tensor, "fit target d"], sum_y: Float[torch.Tensor, "fit target"], ridge: float
           ) -> tuple[Float[torch.Tensor, "fit target d"], Float[torch.Tensor, "fit target"]]:
    """Weights and intercepts of :func:`_fit`'s standardised ridge with penalty ``ridge``, for every
    fit's moments (``n`` rows, their sums, Gram matrix and ``X'y`` per target), as its normal
    equations in raw units, ``(Cov + ridge · diag(Var)) w = Cov(x, y)``, solved directly: one
    Cholesky factorisation per fit (about a sixth of an eigendecomposition's cost; the two agree
    to float64 round-off). ``gram`` is overwritten."""
    mean_x = sum_x / n[:, None]
    cov = gram.div_(n[:, None, None]).sub_(mean_x[:, :, None] * mean_x[:, None, :])
    variance = cov.diagonal(dim1=-2, dim2=-1)
    std = variance.clamp(min=0).sqrt()
    std = torch.where(std > 1e-12 * std.amax(-1, keepdim=True).clamp(min=1e-300), std, torch.ones_like(std))
    mean_y = sum_y / n[:, None]
    cxy = xty / n[:, None, None] - mean_y[..., None] * mean_x[:, None, :]
    variance.add_(ridge * std ** 2)  # positive definite: ridge > 0
    w = torch.cholesky_solve(cxy.transpose(1, 2), torch.linalg.cholesky(cov)).transpose(1, 2)
    return w, mean_y - (w * mean_x[:, None, :]).sum(-1)


def _refit(moments: Sequence[_Moments], counts: np.ndarray, ridge: float
           ) -> tuple[Float[torch.Tensor, "target fit d"], Float[torch.Tensor, "target fit"]]:
    """The probe refitted on re-weighted training units (``moments``: each unit's,
    :meth:`_Unit.moments`; ``counts``: ``[fit, unit]`` multiplicities; the jackknife's rows leave
    one unit out), every target, the same penalty ``ridge``: weights and intercepts as
    :func:`_fit` computes them from the weighted moments (:func:`_solve`)."""
    weights = torch.as_tensor(counts, dtype=torch.float64)
    w, intercept = _solve(weights @ torch.tensor([float(m.n) for m in moments], dtype=torch.float64),
                          weights @ torch.stack([m.sum_x for m in moments]),
                          torch.einsum("fu,uij->fij", weights, torch.stack([m.gram for m in moments])),
                          torch.einsum("fu,utd->ftd", weights, torch.stack([m.xty for m in moments])),
                          weights @ torch.stack([m.sum_y for m in moments]), ridge)
    return w.transpose(0, 1), intercept.T


def _choose_ridge(fold_a: _Moments, fold_b: _Moments, grid: Sequence[float]) -> float:
    """The penalty with the best mean R² across the two folds (fit on one, score the other)."""
    scores = np.zeros(len(grid))
    for fit_on, score_on in ((fold_a, fold_b), (fold_b, fold_a)):
        weights, intercepts = zip(*_fit(fit_on, (0,), grid)[0])
        scores += _r2(score_on, 0, torch.stack(weights), torch.stack(intercepts)).numpy()
    return float(grid[int(np.argmax(scores))])


def _r2(test: _Moments, target: int, w: Float[torch.Tensor, "*probe d"], c: Float[torch.Tensor, "*probe"]
        ) -> Float[torch.Tensor, "*probe"]:
    """R² of ``c + x @ w`` against the test labels ``target``, for one probe or a stack of them."""
    n = test.n
    sse = (test.sum_y2[target] - 2 * (c * test.sum_y[target] + w @ test.xty[target])
           + n * c * c + 2 * c * (w @ test.sum_x) + ((w @ test.gram) * w).sum(-1))
    sst = test.sum_y2[target] - test.sum_y[target] ** 2 / n
    return 1 - sse / sst


@dataclass(repr=False)
class ProbeResult(SavedResult):
    """``layers``: one row per layer: ``r2_heldout`` (R² of log(i+1) on held-out sequences,
    at most 1), ``r2_train``, ``r2_shuffled`` (probe trained on shuffled positions, scored on
    true held-out positions), ``ridge`` (the penalty used), ``n_train``/``n_test`` (rows:
    sequences x positions), and the intervals ``r2_heldout_lo``/``_hi`` and
    ``r2_shuffled_lo``/``_hi`` (held-out bootstrap and refit jackknife; NaN when intervals are
    off or fewer than 2 sequences are held out or trained on; module docstring).
    ``provenance``: model, data, seed, options, and ``intervals`` (method, level, resamples,
    units, scope)."""

    KEYWORD = "probe"
    TABLES = (
        Table("probe_layers", "layers",
              "ProbeResult.layers"),
    )

    layers: pd.DataFrame
    provenance: dict[str, Any]

    WHAT = "position probes: held-out R² of log(i+1) from the residual stream, per layer"

    def headline(self) -> list[Headline]:
        """The held-out R² at the first, best and last layer, and the shuffled-position control."""
        if not len(self.layers):
            return []
        frame = self.layers.sort_values("layer")
        picks = {"first layer": frame.iloc[0], "best layer": frame.loc[frame["r2_heldout"].astype(float).idxmax()],
                 "last layer": frame.iloc[-1]}
        out = [Headline("r2_heldout", f"R² held out, {what} (L{int(row['layer'])})", row_estimate(row, "r2_heldout"),
                        "at most 1; 0 = no better than the mean") for what, row in picks.items()]
        worst = frame.loc[frame["r2_shuffled"].astype(float).idxmax()]
        out.append(Headline("r2_shuffled", f"R² with shuffled positions, at most (L{int(worst['layer'])})",
                            row_estimate(worst, "r2_shuffled"), "the chance level"))
        return out


class ProbeReducer:
    """The probe's streaming moments as a reducer for :func:`lens_position.core.stream.stream`:
    reads ``resid_pre`` of the probed layers and keeps, per layer, the moments of the test
    sequences and of the two training folds. Options as in :func:`position_probe`; call
    :meth:`result` after streaming."""

    def __init__(self, loaded: LoadedModel, prompts: CheckedPrompts, *,
                 layers: Sequence[int] | int | str | None = None, ridge: float | None = None, seed: int = 0,
                 positions: tuple[int, int | None] = (1, None), bootstrap: Bootstrap = Bootstrap()) -> None:
        self.loaded = loaded
        checked = require_checked(loaded, prompts, "ProbeReducer", min_length=2, distinct=bootstrap.enabled)
        tokens, self.data = checked.tokens, checked.spec
        n_seq, length = tokens.shape
        if n_seq < (2 if ridge is not None else PROBE_MIN_N):
            raise BadInputError("a held-out probe needs at least 2 sequences, and 3 when the penalty is chosen "
                                "by cross-validation (ridge=None): pass more prompts or a fixed ridge")
        layers = check_layers(layers, self.loaded.spec.n_layers)
        seed = check_seed(seed)
        if ridge is not None:  # NaN or a negative penalty makes the normal equations singular
            ridge = check_positive("ridge", ridge)
        if len(positions) != 2:
            raise BadInputError(f"positions must be a (start, stop) pair (stop None: to the end), got {positions!r}")
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
        self.d_model = self.loaded.spec.d_model
        self.moments = {layer: [_Moments.zeros(self.d_model, 2) for _ in range(3)] for layer in layers}
        # held-out sequence k (in index order) belongs to resampling unit k % n_units
        test_rows = (self.split == 0).nonzero().squeeze(1)
        self.n_units = min(len(test_rows), PROBE_INTERVAL_GROUPS) if bootstrap.enabled else 0
        self.unit_of = torch.full((n_seq,), -1, dtype=torch.long)
        if self.n_units:
            self.unit_of[test_rows] = torch.arange(len(test_rows)) % self.n_units
        self.units = {layer: [_Unit(self.d_model) for _ in range(self.n_units)] for layer in layers}
        # training sequence k (in index order) belongs to training unit k % n_train_units, left out in turn
        train_rows = (self.split > 0).nonzero().squeeze(1)
        self.n_train_units = min(len(train_rows), PROBE_INTERVAL_GROUPS) if self.n_units else 0
        self.train_unit_of = torch.full((n_seq,), -1, dtype=torch.long)
        if self.n_train_units:
            self.train_unit_of[train_rows] = torch.arange(len(train_rows)) % self.n_train_units
        self.train_units = {layer: [_Unit(self.d_model, n_targets=2) for _ in range(self.n_train_units)]
                            for layer in layers}
        # With intervals, every row is also kept by a unit, so each row enters one Gram matrix only: the
        # held-out R² is read from the held-out units' rows (no Gram matrix of the held-out sequences), and
        # when each training unit's sequences lie in one fold (at most PROBE_INTERVAL_GROUPS training
        # sequences: one per unit), a fold's moments are the sum of its units'.
        self.fold_of_unit: list[int] | None = None
        if self.n_train_units:
            folds = [set(self.split[self.train_unit_of == unit].tolist()) for unit in range(self.n_train_units)]
            if all(len(fold) == 1 for fold in folds):
                self.fold_of_unit = [fold.pop() for fold in folds]
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
        for k, (unit, train_unit) in enumerate(zip(self.unit_of[rows].tolist(), self.train_unit_of[rows].tolist())):
            if unit >= 0:
                self.units[layer][unit].add(raw[k], self.label[:, None], self.reference[layer])
            if train_unit >= 0:
                self.train_units[layer][train_unit].add(raw[k], torch.stack([self.label, self.shuffled[rows[k]]], -1),
                                                        self.reference[layer])
        for part, moment in enumerate(self.moments[layer]):
            if (self.n_units if part == 0 else self.fold_of_unit is not None):
                continue  # read from the units after the stream (__init__)
            chosen = (self.split[rows] == part).nonzero().squeeze(1)
            if len(chosen) == 0:
                continue
            y = torch.stack([self.label.expand(len(chosen), -1), self.shuffled[rows[chosen]]], dim=-1)
            moment.add(x[chosen].reshape(-1, self.d_model), y.reshape(-1, 2))

    def result(self) -> ProbeResult:
        """Fit the probes from the streamed moments (:class:`ProbeResult`)."""
        records = []
        for layer in self.layers:
            if layer not in self.reference:
                raise BadInputError("the probe's prompts were not streamed (no test or training rows)")
            reference = self.reference[layer]
            with_intervals = self.n_units >= 2 and self.n_train_units >= 2
            unit_moments = ([unit.moments(reference) for unit in self.train_units[layer]]
                            if with_intervals or self.fold_of_unit is not None else [])
            if self.fold_of_unit is not None:
                self.moments[layer][1:] = [sum((m for m, fold in zip(unit_moments, self.fold_of_unit) if fold == part),
                                               _Moments.zeros(self.d_model, 2)) for part in (1, 2)]
            test, fold_a, fold_b = self.moments[layer]
            if fold_a.n == 0:
                raise BadInputError("the probe's prompts were not streamed (no test or training rows)")
            train = fold_a + fold_b
            penalty = self.ridge if self.ridge is not None else _choose_ridge(fold_a, fold_b, RIDGE_GRID)
            weights, intercepts = _solve(torch.tensor([float(train.n)], dtype=torch.float64), train.sum_x[None],
                                         train.gram[None].clone(), train.xty[None], train.sum_y[None], penalty)
            (w, w_shuffled), (c, c_shuffled) = weights[0], intercepts[0]  # true and shuffled labels
            if self.n_units:  # held-out errors from the units' rows: [unit, probe]
                units = self.units[layer]
                errors = torch.stack([unit.errors(reference, weights[0], intercepts[0]) for unit in units])
                n, sum_y, sum_y2 = (sum(v) for v in zip(*(unit.label_sums() for unit in units)))
                n_test = int(n)
            else:
                errors, n_test = None, test.n
            if n_test == 0:
                raise BadInputError("the probe's held-out prompts were not streamed (no test rows)")
            if errors is not None:
                r2_heldout, r2_shuffled = (1.0 - errors.sum(0) / (sum_y2 - sum_y ** 2 / n)).tolist()
            else:
                r2_heldout, r2_shuffled = float(_r2(test, 0, w, c)), float(_r2(test, 0, w_shuffled, c_shuffled))
            bounds = self._intervals(layer, penalty, unit_moments, errors,
                                     {"r2_heldout": r2_heldout, "r2_shuffled": r2_shuffled})
            records.append({
                "layer": layer, "r2_heldout": r2_heldout, "r2_train": float(_r2(train, 0, w, c)),
                "r2_shuffled": r2_shuffled, "ridge": penalty, "n_train": train.n, "n_test": n_test, **bounds,
            })
        ridge = self.ridge if self.ridge is not None else {"grid": list(RIDGE_GRID),
                                                           "chosen_by": "2-fold CV within training"}
        prov = provenance.collect(model=self.loaded.spec, data=self.data, seed=self.seed, layers=self.layers,
                                  ridge=ridge, positions=[self.start, self.stop], target="log(i+1)",
                                  features="resid_pre, standardised",
                                  split="half of the sequences held out (seeded)",
                                  test_sequences=(self.split == 0).nonzero().squeeze(1).tolist(),
                                  control="labels permuted within each training sequence",
                                  intervals={**self.bootstrap.to_dict("sequence"), "units": self.n_units,
                                             "training_units": self.n_train_units,
                                             "scope": "bootstrap over units of held-out sequences of the fitted "
                                                      "probe's held-out R², its spread stretched about the "
                                                      "estimate to add the refit's variance: the delete-one-unit "
                                                      "jackknife over the training units, each fit refitted with "
                                                      "the penalty chosen on all the training sequences",
                                             "columns": ["r2_heldout", "r2_shuffled"]})
        return ProbeResult(layers=pd.DataFrame(records), provenance=prov)

    def _intervals(self, layer: int, ridge: float, unit_moments: Sequence[_Moments], errors: torch.Tensor | None,
                   estimates: dict[str, float]) -> dict[str, float]:
        """``{name_lo, name_hi}`` for each probe (the true and the shuffled target, in that order;
        ``errors[unit, probe]``: the fitted probes' squared errors on each held-out unit): the
        bootstrap over held-out units of its held-out R² with the fitted weights, its spread
        stretched about the estimate so that its variance also holds the refit's, the
        delete-one-unit jackknife variance over the training units (``unit_moments``; each
        jackknife fit refitted exactly, :func:`_refit`; module docstring). NaN without
        intervals or with fewer than 2 units on either side."""
        names = list(estimates)
        out = {f"{name}_{side}": float("nan") for name in names for side in ("lo", "hi")}
        if errors is None or self.n_units < 2 or self.n_train_units < 2:
            return out
        reference, units = self.reference[layer], self.units[layer]
        n, sum_y, sum_y2 = (torch.tensor(v, dtype=torch.float64) for v in zip(*(unit.label_sums() for unit in units)))
        total = float(sum_y2.sum() - sum_y.sum() ** 2 / n.sum())
        counts = resample_counts(self.n_units, self.bootstrap.n_resamples, self.bootstrap.seed).numpy().astype(float)
        n_b, sum_y_b, sum_y2_b = counts @ n.numpy(), counts @ sum_y.numpy(), counts @ sum_y2.numpy()
        total_b = sum_y2_b - sum_y_b ** 2 / n_b
        leave_one_out = 1.0 - np.eye(self.n_train_units)
        refits, intercepts = _refit(unit_moments, leave_one_out, ridge)
        for k, name in enumerate(names):
            replicates = small_sample_widening(estimates[name], 1.0 - counts @ errors[:, k].numpy() / total_b,
                                               self.n_units)
            jackknife_errors = torch.stack([unit.errors(reference, refits[k], intercepts[k]) for unit in units])
            jackknife = (1.0 - jackknife_errors.sum(0) / total).numpy()
            refit_variance = (len(jackknife) - 1) / len(jackknife) * ((jackknife - jackknife.mean()) ** 2).sum()
            heldout_variance = float(np.var(replicates))
            stretch = np.sqrt(1.0 + refit_variance / heldout_variance) if heldout_variance > 0 else 1.0
            lo, hi = percentile_interval(estimates[name] + (replicates - estimates[name]) * stretch,
                                         self.bootstrap.level)
            out[f"{name}_lo"], out[f"{name}_hi"] = float(lo), float(hi)
        return out


@public
def position_probe(
    loaded: LoadedModel,
    prompts: Prompts,
    *,
    layers: Sequence[int] | int | str | None = None,
    ridge: float | None = None,
    seed: int = 0,
    positions: tuple[int, int | None] = (1, None),
    batch_size: int = BATCH_SIZE,
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
        bootstrap: the intervals of the held-out R² (module docstring; ``NO_INTERVALS``
            switches them off and keeps no rows).
        progress: show a progress bar.

    To probe in the same pass as other statistics, stream a :class:`ProbeReducer` with them.
    """
    batch_size = check_count("batch_size", batch_size)
    prompts = checked_prompts(loaded, prompts, min_length=2, distinct=bootstrap.enabled)
    reducer = ProbeReducer(loaded, prompts, layers=layers, ridge=ridge, seed=seed, positions=positions,
                           bootstrap=bootstrap)
    stream.body(loaded, prompts, [reducer], batch_size=batch_size, progress=progress, desc="position probe")
    return reducer.result()
