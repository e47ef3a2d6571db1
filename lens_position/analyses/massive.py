"""Massive activations (Sun, Chen, Kolter and Liu, 2024), the heads that read them, and what
removing them does to the sink, to R' and to the loss.

**Definition**, as Sun et al.'s code computes it (locuslab/massive-activations, ``main_llm.py``,
the layer-wise analysis): per sequence and layer, the hidden state the decoder layer outputs
(TransformerLens: ``blocks.l.hook_resid_post``), its absolute values over every (position,
dimension): the three largest and the median. An entry is *massive* when its magnitude is at least
``min_magnitude`` (100) and at least ``min_ratio`` (1000) times the median, their paper's
criterion. Magnitudes are in the residual stream's own units (for Gemma-3, after its embedding
scale).

**Readers.** A head of layer ``l`` reads the massive positions when its attention on the positions
holding a massive entry in its input (``resid_post`` of layer ``l - 1``), summed over them and
averaged over the queries that see them, exceeds ``eps`` (0.3): the sink heads whose keys and values
are those positions'.

**Interventions** (:func:`massive_intervention`), Sun et al.'s ``set_zero`` and ``set_mean``
(``lib/hook.py``): at the output of the layer where the massive activations appear, the massive
(position, dimension) entries are set to 0 or to their mean over the prompts (Sun et al. use means
over other sequences, hard-coded per model; here they are the prompts' own), and the effect is
measured on Gu et al.'s sink rate at position 0, on R' (the reference-free residual component,
held out) and on the next-token loss (nats per token), each as a paired difference over prompts with
its bootstrap interval.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float

from lens_position.analyses.compare import compare
from lens_position.analyses.decompose import decompose
from lens_position.analyses.patching import as_tokens
from lens_position.analyses.sinks import SINK_EPS, SinkScoreReducer
from lens_position.core.checks import check_count, check_fraction, check_int, check_layers, check_same_model
from lens_position.core.inputs import CheckedPrompts, Prompts, checked_prompts
from lens_position.core.intervals import PROBABILITY, Bootstrap, Estimate, bootstrap_mean
from lens_position.core.results import SavedResult, Table
from lens_position.core.stream import BATCH_SIZE, LOGITS, stream
from lens_position.core.summaries import Headline, row_estimate
from lens_position.ground import provenance
from lens_position.ground.errors import BadInputError
from lens_position.ground.progress import progress as progress_bar
from lens_position.models.spec import LoadedModel, public

__all__ = ["MassiveActivations", "MassiveIntervention", "massive_activations", "massive_intervention"]

MIN_MAGNITUDE = 100.0
MIN_RATIO = 1000.0
TOP_K = 3
MODES = ("set_zero", "set_mean")

Entry = tuple[int, int]  # (position, dimension)


class MassiveReducer:
    """Per prompt and layer: the ``TOP_K`` largest ``|resid_post|`` with their (position, dimension),
    the median, the massive entries, and per head the attention on the positions that were massive in
    the layer's input (:func:`lens_position.core.stream.stream` reducer)."""

    def __init__(self, n_prompts: int, n_layers: int, n_heads: int, *, min_magnitude: float,
                 min_ratio: float) -> None:
        self.resid_names = [f"blocks.{layer}.hook_resid_post" for layer in range(n_layers)]
        self.pattern_names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(n_layers)]
        self.hook_names = tuple(name for pair in zip(self.pattern_names, self.resid_names, strict=True)
                                for name in pair)
        self.min_magnitude, self.min_ratio = min_magnitude, min_ratio
        self.top = torch.full((n_prompts, n_layers, TOP_K), float("nan"), dtype=torch.float64)
        self.top_where = torch.full((n_prompts, n_layers, TOP_K, 2), -1, dtype=torch.int64)
        self.median = torch.full((n_prompts, n_layers), float("nan"), dtype=torch.float64)
        self.read = torch.full((n_prompts, n_layers, n_heads), float("nan"), dtype=torch.float64)
        self.massive: dict[tuple[int, int], list[tuple[int, int, float]]] = {}  # (prompt, layer) -> entries
        self._positions: dict[int, list[int]] = {}  # prompt -> massive positions of the last resid_post

    def update(self, hook_name: str, activation: torch.Tensor, rows: torch.Tensor) -> None:
        if hook_name.endswith("hook_pattern"):
            self._read_pattern(int(hook_name.split(".")[1]), activation, rows)
        else:
            self._read_resid(int(hook_name.split(".")[1]), activation, rows)

    def _read_resid(self, layer: int, resid: Float[torch.Tensor, "batch pos d_model"], rows: torch.Tensor) -> None:
        values = resid.detach().to(torch.float64).cpu()
        magnitude = values.abs().flatten(1)
        top = magnitude.topk(TOP_K, dim=1)
        median = magnitude.median(dim=1).values
        d_model = values.shape[-1]
        for b, row in enumerate(rows.tolist()):
            self.top[row, layer] = top.values[b]
            self.top_where[row, layer, :, 0] = top.indices[b] // d_model
            self.top_where[row, layer, :, 1] = top.indices[b] % d_model
            self.median[row, layer] = median[b]
            hits = ((magnitude[b] >= self.min_magnitude) & (magnitude[b] >= self.min_ratio * median[b])).nonzero()
            entries = [(int(i) // d_model, int(i) % d_model, float(values[b].flatten()[i])) for i in hits.flatten()]
            self.massive[row, layer] = entries
            self._positions[row] = sorted({position for position, _, _ in entries})

    def _read_pattern(self, layer: int, pattern: Float[torch.Tensor, "batch head query key"],
                      rows: torch.Tensor) -> None:
        if layer == 0:
            return  # its input is the embedding: no layer output to be massive in
        pattern = pattern.detach().to(torch.float64).cpu()
        for b, row in enumerate(rows.tolist()):
            keys = self._positions.get(row, [])
            self.read[row, layer] = pattern[b, :, max(keys):, keys].sum(-1).mean(-1) if keys else 0.0


@dataclass(repr=False)
class MassiveActivations(SavedResult):
    """Result of :func:`massive_activations`. ``layers``: one row per layer with ``top1``, ``top2``,
    ``top3`` (the largest ``|resid_post|`` entries, mean over prompts, with intervals ``_lo``/``_hi``),
    ``median_abs`` (the median ``|resid_post|``), ``ratio`` (top1 over the median, mean over prompts, with
    its interval), ``top1_position`` / ``top1_dim`` (where the largest entry is in most prompts),
    ``n_massive`` (massive entries per prompt, mean) and ``share_massive`` (the fraction of prompts with
    one). ``entries``: one row per massive (layer, position, dim) with ``n_prompts``, ``mean_value`` (its mean
    signed value where massive) and ``magnitude``. ``readers``: one row per (layer, head) with
    ``attention_on_massive`` (attention on the positions massive in the layer's input, in [0, 1]),
    its interval, and ``is_reader`` (above ``eps``). ``interventions``: :class:`MassiveIntervention`'s
    frame where a reproduction step measured it (None otherwise)."""

    KEYWORD = "massive"
    TABLES = (
        Table("massive_layers", "layers", "MassiveActivations.layers"),
        Table("massive_entries", "entries", "MassiveActivations.entries"),
        Table("massive_readers", "readers", "MassiveActivations.readers"),
        Table("massive_intervention", "interventions", "MassiveActivations.interventions"),
    )

    layers: pd.DataFrame
    entries: pd.DataFrame
    readers: pd.DataFrame
    provenance: dict[str, Any] = field(default_factory=dict)
    interventions: pd.DataFrame | None = None  # MassiveIntervention.frame, where a run added it

    WHAT = "massive activations (Sun et al. 2024) per layer, and the heads that read them"
    INTERVALS = "95% bootstrap over prompts"
    HEADS = ("readers", "attention_on_massive")

    def headline(self) -> list[Headline]:
        """The largest activation of any layer, its ratio to the median, and how many heads read the
        massive positions."""
        row = self.layers.loc[self.layers["top1"].astype(float).idxmax()]
        where = f"L{int(row['layer'])}, position {int(row['top1_position'])}, dim {int(row['top1_dim'])}"
        return [Headline("top1", f"largest |activation| ({where})", row_estimate(row, "top1"),
                         "residual-stream units"),
                Headline("ratio", f"its ratio to the median (L{int(row['layer'])})", row_estimate(row, "ratio"),
                         "top-1 |activation| over the median |activation|"),
                Headline("is_reader", "heads reading the massive positions", Estimate(
                    float(self.readers["is_reader"].sum())), f"of {len(self.readers)} heads")]

    def first_layer(self, share: float = 0.5) -> int | None:
        """The first layer whose output holds a massive entry in at least ``share`` of the prompts."""
        hits = self.layers[self.layers["share_massive"] >= share]
        return None if hits.empty else int(hits["layer"].iloc[0])

    def common_entries(self, layer: int, share: float = 0.5) -> list[Entry]:
        """The (position, dim) massive at ``layer`` in at least ``share`` of the prompts."""
        rows = self.entries[(self.entries["layer"] == layer) & (self.entries["share"] >= share)]
        return [(int(p), int(d)) for p, d in zip(rows["position"], rows["dim"], strict=True)]


def _estimate_columns(frame: pd.DataFrame, name: str, values: np.ndarray, bootstrap: Bootstrap,
                      bounds: tuple[float, float] | None = None) -> None:
    mean, lo, hi = bootstrap_mean(values, bootstrap, bounds)
    frame[name], frame[f"{name}_lo"], frame[f"{name}_hi"] = mean, lo, hi


def _layer_table(reducer: MassiveReducer, bootstrap: Bootstrap) -> pd.DataFrame:
    n_prompts, n_layers, _ = reducer.top.shape
    frame = pd.DataFrame({"layer": np.arange(n_layers)})
    for k in range(TOP_K):
        _estimate_columns(frame, f"top{k + 1}", reducer.top[:, :, k].numpy(), bootstrap)
    frame["median_abs"] = reducer.median.numpy().mean(0)
    _estimate_columns(frame, "ratio", (reducer.top[:, :, 0] / reducer.median).numpy(), bootstrap)
    for column, axis in (("top1_position", 0), ("top1_dim", 1)):
        frame[column] = [Counter(reducer.top_where[:, layer, 0, axis].tolist()).most_common(1)[0][0]
                         for layer in range(n_layers)]
    counts = np.array([[len(reducer.massive.get((p, layer), [])) for layer in range(n_layers)]
                       for p in range(n_prompts)])
    frame["n_massive"] = counts.mean(0)
    frame["share_massive"] = (counts > 0).mean(0)
    frame["n_sequences"] = n_prompts
    return frame


def _entry_table(reducer: MassiveReducer, n_prompts: int) -> pd.DataFrame:
    found: dict[tuple[int, int, int], list[float]] = {}
    for (_, layer), entries in reducer.massive.items():
        for position, dim, value in entries:
            found.setdefault((layer, position, dim), []).append(value)
    rows = [{"layer": layer, "position": position, "dim": dim, "n_prompts": len(values),
             "share": len(values) / n_prompts, "mean_value": float(np.mean(values)),
             "magnitude": float(np.mean(np.abs(values)))} for (layer, position, dim), values in sorted(found.items())]
    columns = ["layer", "position", "dim", "n_prompts", "share", "mean_value", "magnitude"]
    return pd.DataFrame(rows, columns=columns)


@public
def massive_activations(
    loaded: LoadedModel,
    prompts: Prompts,
    *,
    min_magnitude: float = MIN_MAGNITUDE,
    min_ratio: float = MIN_RATIO,
    eps: float = SINK_EPS,
    batch_size: int = BATCH_SIZE,
    bootstrap: Bootstrap = Bootstrap(),
    progress: bool = True,
) -> MassiveActivations:
    """Sun et al.'s massive activations of ``model`` on ``prompts``, per layer, and the heads whose
    attention reads the positions that hold them (module docstring), in one streamed pass."""
    prompts = checked_prompts(loaded, prompts, min_length=2, distinct=bootstrap.enabled)
    eps = check_fraction("eps", eps)
    if not (min_magnitude >= 0 and min_ratio >= 0):
        raise BadInputError(f"min_magnitude and min_ratio must be non-negative numbers, got {min_magnitude!r}, "
                            f"{min_ratio!r}")
    tokens = as_tokens(loaded, prompts)
    spec = loaded.spec
    reducer = MassiveReducer(len(tokens), spec.n_layers, spec.n_heads, min_magnitude=min_magnitude,
                             min_ratio=min_ratio)
    with progress_bar("massive activations", enabled=progress):
        stream.body(loaded, tokens, [reducer], batch_size=check_count("batch_size", batch_size), progress=progress,
               desc="massive activations")
    readers = pd.DataFrame({"layer": np.repeat(np.arange(spec.n_layers), spec.n_heads),
                            "head": np.tile(np.arange(spec.n_heads), spec.n_layers)})
    _estimate_columns(readers, "attention_on_massive", reducer.read.reshape(len(tokens), -1).nan_to_num(0.0).numpy(),
                      bootstrap, PROBABILITY)
    readers["is_reader"] = readers["attention_on_massive"] > eps
    return MassiveActivations(
        layers=_layer_table(reducer, bootstrap), entries=_entry_table(reducer, len(tokens)), readers=readers,
        provenance=provenance.collect(
            model=spec, data=prompts.spec.to_dict(), seed=prompts.spec.seed, min_magnitude=min_magnitude,
            min_ratio=min_ratio, eps=eps, activation="blocks.l.hook_resid_post (the decoder layer's output)",
            definition="Sun et al. 2024: |h| >= min_magnitude and |h| >= min_ratio x median |h| of the layer's "
                       "output over positions and dimensions (locuslab/massive-activations, main_llm.py)",
            intervals=bootstrap.to_dict("prompt")))


# --------------------------------------------------------------------------- interventions


class LossReducer:
    """Next-token loss per prompt (mean cross-entropy over positions ``first .. T-2`` predicting
    ``first + 1 .. T-1``, in nats per token), read from the logits (:data:`lens_position.core.stream.LOGITS`)."""

    hook_names = (LOGITS,)

    def __init__(self, tokens: torch.Tensor, first: int = 0) -> None:
        self.tokens, self.first = tokens, first
        self.loss = torch.full((len(tokens),), float("nan"), dtype=torch.float64)

    def update(self, hook_name: str, logits: Float[torch.Tensor, "batch pos vocab"], rows: torch.Tensor) -> None:
        targets = self.tokens[rows, self.first + 1:].to(logits.device)
        log_probs = logits[:, self.first:-1].to(torch.float64).log_softmax(-1)
        self.loss[rows] = -log_probs.gather(-1, targets[..., None])[..., 0].mean(-1).cpu()


class _EntryReader:
    """The values of (position, dim) entries of one layer's output, per prompt."""

    def __init__(self, layer: int, entries: Sequence[Entry], n_prompts: int) -> None:
        self.hook_names = (f"blocks.{layer}.hook_resid_post",)
        self.entries = list(entries)
        self.values = torch.zeros(n_prompts, len(self.entries), dtype=torch.float64)

    def update(self, hook_name: str, resid: torch.Tensor, rows: torch.Tensor) -> None:
        for e, (position, dim) in enumerate(self.entries):
            self.values[rows, e] = resid[:, position, dim].detach().to(torch.float64).cpu()


def entry_hook(layer: int, entries: Sequence[Entry], fill: Sequence[float]) -> tuple[str, Callable]:
    """A forward hook that sets each (position, dim) of ``layer``'s output to its ``fill`` value (Sun
    et al.'s intervention: 0 for ``set_zero``, the mean for ``set_mean``)."""
    def hook(resid: torch.Tensor, hook: Any = None) -> torch.Tensor:
        for (position, dim), value in zip(entries, fill, strict=True):
            resid[:, position, dim] = value
        return resid
    return f"blocks.{layer}.hook_resid_post", hook


@dataclass(repr=False)
class MassiveIntervention(SavedResult):
    """Result of :func:`massive_intervention`. ``frame``: one row per ``intervention`` (``set_zero``,
    ``set_mean``) with the ``layer`` and ``entries`` changed, and for each effect the base value, the
    value with the intervention and the paired change with its interval over prompts:
    ``sink_rate*`` (Gu et al.'s rate at position 0, in [0, 1]), ``R_rf*`` (R', a share of Var(log A),
    from :func:`lens_position.analyses.compare.compare`) and ``loss*`` (next-token loss, nats per
    token)."""

    KEYWORD = "massive_intervention"
    TABLES = (Table("massive_intervention", "frame", "MassiveIntervention.frame"),)

    frame: pd.DataFrame
    provenance: dict[str, Any] = field(default_factory=dict)

    WHAT = "massive activations set to zero or to their mean: the effect on the sink, R' and the loss"
    INTERVALS = "95% bootstrap over prompts (paired differences)"

    def headline(self) -> list[Headline]:
        """Per mode, the change of the sink rate and of the loss."""
        out = []
        for _, row in self.frame.iterrows():
            out.append(Headline("sink_rate_change", f"{row['intervention']}: sink rate change",
                                row_estimate(row, "sink_rate_change"), "fraction of (prompt, layer, head) triples"))
            out.append(Headline("loss_change", f"{row['intervention']}: loss change", row_estimate(row, "loss_change"),
                                "nats per token"))
        return out


def _sink_and_loss(loaded: LoadedModel, prompts: CheckedPrompts, eps: float, hooks: Sequence[tuple[str, Callable]],
                   batch_size: int, desc: str) -> tuple[np.ndarray, np.ndarray]:
    tokens = prompts.tokens.to(loaded.backend.device)
    sinks, loss = SinkScoreReducer(loaded, prompts), LossReducer(tokens)
    stream.body(loaded, tokens, [sinks, loss], fwd_hooks=hooks, batch_size=batch_size, desc=desc)
    rate = (sinks.result() > eps).to(torch.float64).mean((1, 2)).numpy()
    return rate, loss.loss.numpy()


def _paired(row: dict[str, Any], name: str, base: np.ndarray, changed: np.ndarray, bootstrap: Bootstrap) -> None:
    row[f"{name}_base"], row[name] = float(base.mean()), float(changed.mean())
    change, lo, hi = bootstrap_mean(changed - base, bootstrap)
    row[f"{name}_change"], row[f"{name}_change_lo"], row[f"{name}_change_hi"] = float(change), float(lo), float(hi)


def checked_entries(entries: Any, T: int, d_model: int) -> list[Entry]:
    """``entries`` as a list of ``(position, dim)`` pairs within prompts of ``T`` positions and a
    residual stream of ``d_model`` dimensions (BadInputError naming the first that is not)."""
    if isinstance(entries, (str, bytes)) or not isinstance(entries, Sequence) or not entries:
        raise BadInputError(f"entries must be a non-empty list of (position, dim) pairs, e.g. [(0, 12)], got "
                            f"{entries!r}")
    out = []
    for entry in entries:
        if isinstance(entry, (str, bytes)) or not isinstance(entry, Sequence) or len(entry) != 2:
            raise BadInputError(f"each entry is a (position, dim) pair, e.g. (0, 12); got {entry!r}")
        position, dim = check_int("an entry's position", entry[0]), check_int("an entry's dim", entry[1])
        if not (0 <= position < T and 0 <= dim < d_model):
            raise BadInputError(f"entry {tuple(entry)} is outside prompts of T = {T} positions and d_model = "
                                f"{d_model}: use 0 <= position < {T} and 0 <= dim < {d_model}")
        out.append((position, dim))
    return out


@public
def massive_intervention(
    loaded: LoadedModel,
    prompts: Prompts,
    *,
    massive: MassiveActivations | None = None,
    layer: int | None = None,
    entries: Sequence[Entry] | None = None,
    modes: Sequence[str] = MODES,
    eps: float = SINK_EPS,
    batch_size: int = BATCH_SIZE,
    bootstrap: Bootstrap = Bootstrap(),
    progress: bool = True,
) -> MassiveIntervention:
    """Set the massive activations to zero or to their mean (module docstring) and measure the change
    of the sink rate, of R' and of the next-token loss. ``layer`` / ``entries``: where and which
    (position, dim) (default: the first layer whose output is massive in half the prompts, and the
    entries massive there in half the prompts, from ``massive`` or a fresh
    :func:`massive_activations`)."""
    prompts = checked_prompts(loaded, prompts, min_length=2, distinct=bootstrap.enabled)
    eps, batch_size = check_fraction("eps", eps), check_count("batch_size", batch_size)
    if isinstance(modes, str) or not modes or any(m not in MODES for m in modes) or len(set(modes)) != len(modes):
        raise BadInputError(f"modes must name each of {list(MODES)} at most once, got {modes!r}")
    tokens = as_tokens(loaded, prompts)
    if massive is not None:
        if not isinstance(massive, MassiveActivations):
            raise BadInputError(f"massive must be the MassiveActivations of massive_activations(model, prompts), got "
                                f"{type(massive).__name__}")
        check_same_model(loaded, massive.provenance, "massive")
    if layer is not None:
        layer = check_layers([layer], loaded.spec.n_layers)[0]
    if entries is not None:
        entries = checked_entries(entries, tokens.shape[1], loaded.spec.d_model)
    with progress_bar("massive intervention", total=(3 + 2 * len(modes)) * len(tokens), enabled=progress):
        if layer is None or entries is None:
            massive = massive or massive_activations.body(loaded, prompts, eps=eps, batch_size=batch_size,
                                                     bootstrap=bootstrap)
            layer = massive.first_layer() if layer is None else layer
            entries = massive.common_entries(layer) if layer is not None and entries is None else entries
        if layer is None or not entries:
            raise BadInputError("no massive activation to intervene on: no layer's output holds an entry of at least "
                                f"{MIN_MAGNITUDE:g} and {MIN_RATIO:g}x the median in half the prompts; name layer= and "
                                "entries=[(position, dim), ...] to set chosen entries")
        if not 0 <= layer < loaded.spec.n_layers:
            raise BadInputError(f"layer {layer} is outside the model's {loaded.spec.n_layers} layers")
        reader = _EntryReader(layer, entries, len(tokens))
        stream.body(loaded, tokens, [reader], batch_size=batch_size, desc="massive entries")
        base_rate, base_loss = _sink_and_loss(loaded, prompts, eps, (), batch_size, "massive intervention: base")
        base = decompose.body(loaded, prompts, batch_size=batch_size, bootstrap=bootstrap)
        rows = []
        for mode in modes:
            fill = [0.0] * len(entries) if mode == "set_zero" else reader.values.mean(0).tolist()
            hook = entry_hook(layer, entries, fill)
            rate, loss = _sink_and_loss(loaded, prompts, eps, [hook], batch_size, f"massive intervention: {mode}")
            changed = compare(base, {mode: decompose.body(loaded, prompts, fwd_hooks=[hook], batch_size=batch_size,
                                                     bootstrap=bootstrap)}).overall.iloc[0]
            row: dict[str, Any] = {"intervention": mode, "layer": layer,
                                   "entries": "; ".join(f"({p}, {d})" for p, d in entries),
                                   "fill": "; ".join(f"{v:.4g}" for v in fill)}
            _paired(row, "sink_rate", base_rate, rate, bootstrap)
            row.update({"R_rf_base": changed["R_rf_base"], "R_rf": changed["R_rf_condition"],
                        "R_rf_change": changed["R_rf_change"], "R_rf_change_lo": changed["R_rf_change_lo"],
                        "R_rf_change_hi": changed["R_rf_change_hi"]})
            _paired(row, "loss", base_loss, loss, bootstrap)
            rows.append(row)
    return MassiveIntervention(frame=pd.DataFrame(rows).assign(n_sequences=len(tokens)),
                               provenance=provenance.collect(
                                   model=loaded.spec, data=prompts.spec.to_dict(), seed=prompts.spec.seed,
                                   layer=layer, entries=[list(e) for e in entries], modes=list(modes), eps=eps,
                                   intervention="Sun et al.'s set_zero / set_mean at blocks.layer.hook_resid_post; "
                                                "set_mean uses the mean over these prompts",
                                   intervals=bootstrap.to_dict("prompt")))
