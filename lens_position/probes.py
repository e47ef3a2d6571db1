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
from lens_position.models.spec import LoadedModel, as_loaded
from lens_position.results import SavedResult
from lens_position.stream import stream

RIDGE_GRID = tuple(float(x) for x in 10.0 ** np.arange(-4, 3.01, 0.5))


# Sequences a held-out probe needs when its penalty is chosen by cross-validation: one test
# half and two training folds.
PROBE_MIN_N = 3

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


def _fit(train: _Moments, target: int, ridges: Sequence[float]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Ridge weights ``w`` and intercept ``c`` (prediction ``c + x @ w``) from training
    moments, one pair per penalty in ``ridges`` (one eigendecomposition for all)."""
    n = train.n
    mean_x = train.sum_x / n
    mean_y = train.sum_y[target] / n
    cov = train.gram / n - torch.outer(mean_x, mean_x)
    std = cov.diagonal().clamp(min=0).sqrt()
    std = torch.where(std > 1e-12 * std.max().clamp(min=1e-300), std, torch.ones_like(std))
    cxy = train.xty[target] / n - mean_x * mean_y
    eigenvalues, eigenvectors = torch.linalg.eigh(cov / torch.outer(std, std))
    projected = eigenvectors.T @ (cxy / std)
    fits = []
    for ridge in ridges:
        w = (eigenvectors @ (projected / (eigenvalues.clamp(min=0) + ridge))) / std
        fits.append((w, mean_y - mean_x @ w))
    return fits


def _choose_ridge(fold_a: _Moments, fold_b: _Moments, grid: Sequence[float]) -> float:
    """The penalty with the best mean R² across the two folds (fit on one, score the other)."""
    scores = np.zeros(len(grid))
    for fit_on, score_on in ((fold_a, fold_b), (fold_b, fold_a)):
        for k, (w, c) in enumerate(_fit(fit_on, 0, grid)):
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
    sequences x positions).
    ``provenance``: model, data, seed, options."""

    layers: pd.DataFrame
    provenance: dict[str, Any]


class ProbeReducer:
    """The probe's streaming moments as a reducer for :func:`lens_position.stream.stream`:
    reads ``resid_pre`` of the probed layers and keeps, per layer, the moments of the test
    sequences and of the two training folds. Options as in :func:`position_probe`; call
    :meth:`result` after streaming."""

    def __init__(self, model: LoadedModel | HookedTransformer, prompts: Any, *,
                 layers: Sequence[int] | None = None, ridge: float | None = None, seed: int = 0,
                 positions: tuple[int, int | None] = (1, None)) -> None:
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
        self.reference: dict[int, torch.Tensor] = {}
        self.hook_names = tuple(f"blocks.{layer}.hook_resid_pre" for layer in layers)
        self._layer_of = dict(zip(self.hook_names, layers))

    def update(self, hook_name: str, resid: Float[torch.Tensor, "batch pos d_model"],
               rows: torch.Tensor) -> None:
        layer = self._layer_of[hook_name]
        x = resid[:, self.start:self.stop].to(torch.float64).cpu()
        if layer not in self.reference:  # centre on the first batch's mean (avoids cancellation)
            self.reference[layer] = x.reshape(-1, self.d_model).mean(0)
        x = x - self.reference[layer]
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
            (w, c), = _fit(train, 0, [penalty])
            (w_shuffled, c_shuffled), = _fit(train, 1, [penalty])
            records.append({
                "layer": layer, "r2_heldout": _r2(test, 0, w, c), "r2_train": _r2(train, 0, w, c),
                "r2_shuffled": _r2(test, 0, w_shuffled, c_shuffled), "ridge": penalty,
                "n_train": train.n, "n_test": test.n,
            })
        ridge = self.ridge if self.ridge is not None else {"grid": list(RIDGE_GRID),
                                                           "chosen_by": "2-fold CV within training"}
        prov = provenance.collect(model=self.loaded.spec, data=self.data, seed=self.seed, layers=self.layers,
                                  ridge=ridge, positions=[self.start, self.stop], target="log(i+1)",
                                  features="resid_pre, standardised",
                                  split="half of the sequences held out (seeded)",
                                  test_sequences=(self.split == 0).nonzero().squeeze(1).tolist(),
                                  control="labels permuted within each training sequence")
        return ProbeResult(layers=pd.DataFrame(records), provenance=prov)


def position_probe(
    model: LoadedModel | HookedTransformer,
    prompts: Any,
    *,
    layers: Sequence[int] | None = None,
    ridge: float | None = None,
    seed: int = 0,
    positions: tuple[int, int | None] = (1, None),
    batch_size: int = 8,
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
        progress: show a progress bar.

    To probe in the same pass as other statistics, stream a :class:`ProbeReducer` with them.
    """
    batch_size = check_count("batch_size", batch_size)
    prompts = checked_prompts(model, prompts, min_length=2)
    reducer = ProbeReducer(model, prompts, layers=layers, ridge=ridge, seed=seed, positions=positions)
    stream(model, prompts, [reducer], batch_size=batch_size, progress=progress, desc="position probe")
    return reducer.result()
