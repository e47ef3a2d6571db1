"""Position-0 convergence: does the state at position 0 forget the token that made it?

Position 0 attends only to itself, so its residual state at every layer is a function of the
vector at position 0 alone (C5). Replace that vector (another token's embedding, the mean
embedding, a random vector of the same norm: :func:`lens_position.analyses.patching.replacement_embedding`)
and follow the state layer by layer against the unreplaced run:

- ``cosine[l]``: cosine of ``resid_post[l][0]`` (after block ``l``) replaced vs unreplaced;
- ``rel_norm[l]``: ``||replaced|| / ||unreplaced||``; ``distance[l]``: ``||replaced - unreplaced||
  / ||unreplaced||``;
- **converged** layers: those whose cosine interval lies at or above ``1 - tolerance``.

A state that re-converges whatever its token (a circuit that recognises position 0 through the
causal mask would make one) leaves nothing for BOS replacement to remove from what later heads
read there (C4). Which components restore it: at each layer ``l``, the attention output and the
MLP output at position 0 are, one at a time, patched from the unreplaced run into the replaced
one, and the share of the gap ``||replaced - unreplaced||`` they close is measured right after
the block (``closed_here``) and at the last layer (``closed_final``); ``closed_in_run`` is how
much of the gap each sub-block closes in the replaced run itself, without any patch
(``1 - d after / d before`` with ``d`` the gap over the unreplaced state's norm at that point, since
a sub-block may grow the state's norm by orders of magnitude; negative: it widens the gap).

Because position 0 sees only itself, the measurement runs on one-token sequences (each distinct
token 0 of the prompts), exactly what position 0 of any longer prompt computes. Intervals are
percentile bootstrap intervals over the units (distinct token 0 x replacement instance): with BOS
at position 0 of every prompt the prompts are one unit, and the spread is over replacements.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int

from lens_position.analyses.patching import as_tokens, default_replacement_token, replacement_embedding
from lens_position.core.checks import check_count, check_seed
from lens_position.core.inputs import Prompts, checked_prompts
from lens_position.core.intervals import Bootstrap, Estimate, bootstrap_mean
from lens_position.core.results import SavedResult, Table
from lens_position.core.summaries import Headline, row_estimate
from lens_position.ground import provenance
from lens_position.ground.errors import BadInputError
from lens_position.models.backends import ModelBackend
from lens_position.models.spec import LoadedModel, public

REPLACEMENTS = ("token", "mean", "random")
DEFAULT_TOLERANCE = 0.02  # converged: cosine to the unreplaced state at least 0.98
COMPONENTS = ("attn", "mlp")
_NO_GAP = 1e-9  # a gap below this fraction of the unreplaced state's norm is no gap: nothing to close


@dataclass(repr=False)
class Position0Convergence(SavedResult):
    """Result of :func:`position0_convergence`.

    ``layers``: one row per layer ``l`` (the state after block ``l``): ``cosine``, ``rel_norm``,
    ``distance`` (module docstring; dimensionless), each the mean over units with its interval
    (``*_lo``/``*_hi``), ``converged`` (``cosine_lo >= 1 - tolerance``) and ``tolerance``.
    ``per_replacement``: the same per (replacement instance, token 0, layer), no intervals.
    ``restoration``: one row per (layer, component ``"attn"``/``"mlp"``): ``closed_here``,
    ``closed_final`` and ``closed_in_run`` (fractions of the gap, 1 = closed, negative = widened),
    means over the units that had a gap to close, with intervals (NaN where none had: a state
    already converged leaves nothing for a patch to restore).
    ``first_converged_layer``: the first layer from which every later layer is converged (None:
    the state has not converged by the last layer)."""

    KEYWORD = "convergence"
    TABLES = (
        Table("convergence_layers", "layers",
              "Position0Convergence.layers: cosine and norm of the replaced position-0 state per layer"),
        Table("convergence_restoration", "restoration",
              "Position0Convergence.restoration: the gap each attention / MLP output at position 0 closes"),
    )

    layers: pd.DataFrame
    per_replacement: pd.DataFrame
    restoration: pd.DataFrame
    tolerance: float
    first_converged_layer: int | None
    provenance: dict[str, Any] = field(default_factory=dict)

    WHAT = "position-0 convergence: the state after a replaced embedding against the unreplaced one"
    INTERVALS = "95% bootstrap over replacements"

    def headline(self) -> list[Headline]:
        """The first converged layer, the cosine at the first and last layers, and the component that
        closes most of the gap at the last layer."""
        first = self.first_converged_layer
        out = [Headline("converged", f"first converged layer (cosine_lo >= {1 - self.tolerance:g})",
                        Estimate(float("nan") if first is None else float(first)),
                        "not converged by the last layer" if first is None else "every later layer converged too")]
        for label, row in (("first", self.layers.iloc[0]), ("last", self.layers.iloc[-1])):
            out.append(Headline("cosine", f"cosine to the unreplaced state, {label} layer (L{int(row['layer'])})",
                                row_estimate(row, "cosine"), "mean over replacements, in [-1, 1]"))
        closing = self.restoration.dropna(subset=["closed_final"])
        if len(closing):
            top = closing.loc[closing["closed_final"].astype(float).idxmax()]
            out.append(Headline("closed_final", f"gap closed at the last layer by {top['component']} of "
                                                f"L{int(top['layer'])}",
                                row_estimate(top, "closed_final"), "fraction of the gap, 1 = closed"))
        return out


#: The most replaced position-0 vectors one convergence run takes (they run as one batch).
MAX_INSTANCES = 4096


def _instances(loaded: LoadedModel, tokens: torch.Tensor, replacements: Sequence[str], n_tokens: int,
               n_random: int, seed: int) -> list[tuple[str, torch.Tensor]]:
    """Every replacement instance as (label, ``[units, d_model]`` vector per token-0 row)."""
    out = []
    drawn: list[int] = []
    for replacement in replacements:
        if replacement == "token":
            for k in range(n_tokens):
                token = default_replacement_token.body(loaded, tokens, position=0, seed=seed + k)
                if token in drawn:  # a seed that draws a token already used adds no new instance
                    continue
                drawn.append(token)
                out.append((f"token:{token}", replacement_embedding.body(loaded, tokens, "token", token=token)))
        elif replacement == "mean":
            out.append(("mean", replacement_embedding.body(loaded, tokens, "mean")))
        else:
            for k in range(n_random):
                out.append((f"random:{seed + k}", replacement_embedding.body(loaded, tokens, "random", seed=seed + k)))
    return out


def _run(backend: ModelBackend, tokens: Int[torch.Tensor, "unit one"],
         embedding: Float[torch.Tensor, "unit d_model"] | None) -> dict[str, torch.Tensor]:
    """One forward pass on one-token sequences, with the embedding at position 0 replaced
    (None: not); every block's residual states at
    position 0 (``resid_pre``, ``resid_mid``, ``resid_post``, float64, ``[layer, unit, d_model]``)
    and the attention and MLP outputs."""
    names = ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out", "hook_mlp_out")
    kept: dict[str, list[torch.Tensor]] = {name: [] for name in names}
    hooks = []
    if embedding is not None:
        def replace(activation: torch.Tensor, hook: Any) -> torch.Tensor:
            activation[:, 0] = embedding.to(activation.dtype)
            return activation
        hooks.append(("hook_embed", replace))
    for name in names:
        def keep(activation: torch.Tensor, hook: Any, name: str = name) -> None:
            kept[name].append(activation[:, 0].detach().to(torch.float64).cpu())
        hooks.extend((f"blocks.{layer}.{name}", keep) for layer in range(backend.n_layers))
    with torch.no_grad(), backend.hooks(hooks):
        backend.forward(tokens, stop_at_layer=backend.n_layers, return_type=None)  # no unembedding
    return {name.removeprefix("hook_"): torch.stack(values) for name, values in kept.items()}


MAX_PATCHED_ROWS = 512  # one-token rows per forward pass of the restoration runs


def _run_patched(backend: ModelBackend, tokens: Int[torch.Tensor, "unit one"],
                 embedding: Float[torch.Tensor, "unit d_model"],
                 patches: Sequence[tuple[str, Float[torch.Tensor, "unit d_model"]]]
                 ) -> Float[torch.Tensor, "condition layer unit d_model"]:
    """The replaced runs with one activation patched each, several patches to a forward pass:
    condition ``k`` is ``tokens`` again (its own block of rows) with ``patches[k]`` (hook name,
    value per unit) set at position 0. Returns every block's ``resid_post`` at position 0 per
    condition (float64). Rows never interact (one-token sequences, no batch statistics), so each
    condition's numbers are those of its own run."""
    units = len(tokens)
    per_pass = max(1, MAX_PATCHED_ROWS // units)
    out: list[torch.Tensor] = []
    for start in range(0, len(patches), per_pass):
        chunk = patches[start:start + per_pass]
        by_hook: dict[str, list[tuple[int, torch.Tensor]]] = {}
        for k, (name, value) in enumerate(chunk):
            by_hook.setdefault(name, []).append((k, value))
        rows = tokens.repeat(len(chunk), 1)
        rows_embedding = embedding.repeat(len(chunk), 1)
        kept: list[torch.Tensor] = []

        def replace(activation: torch.Tensor, hook: Any, rows_embedding: torch.Tensor = rows_embedding) -> torch.Tensor:
            activation[:, 0] = rows_embedding.to(activation.dtype)
            return activation

        def set_values(activation: torch.Tensor, hook: Any,
                       values: list[tuple[int, torch.Tensor]]) -> torch.Tensor:
            for k, value in values:
                activation[k * units:(k + 1) * units, 0] = value.to(activation.dtype)
            return activation

        def keep(activation: torch.Tensor, hook: Any, kept: list[torch.Tensor] = kept) -> None:
            kept.append(activation[:, 0].detach().to(torch.float64).cpu())

        hooks: list[tuple[str, Callable[..., Any]]] = [("hook_embed", replace),
                 *((name, functools.partial(set_values, values=values)) for name, values in by_hook.items()),
                 *((f"blocks.{layer}.hook_resid_post", keep) for layer in range(backend.n_layers))]
        with torch.no_grad(), backend.hooks(hooks):
            backend.forward(rows, stop_at_layer=backend.n_layers, return_type=None)
        post = torch.stack(kept)  # [layer, condition * unit, d_model]
        out.extend(post[:, k * units:(k + 1) * units] for k in range(len(chunk)))
    return torch.stack(out)


def _cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1)).clamp_min(1e-300)


def _check_options(loaded: LoadedModel, replacements: Sequence[str], tolerance: float) -> None:
    unknown = [r for r in replacements if r not in REPLACEMENTS]
    if unknown or not replacements:
        raise BadInputError(f"unknown or no replacements {list(replacements)}; choose from {list(REPLACEMENTS)}")
    if not 0 < tolerance < 1:
        raise BadInputError(f"tolerance must lie in (0, 1) (a cosine gap), got {tolerance}")
    if not loaded.backend.has_mlp or "blocks.0.hook_resid_mid" not in loaded.backend.hook_dict:
        raise BadInputError(
            "this model has no MLPs (attn_only): the restoration by component needs both sub-blocks; "
            "use a model with MLPs"
        )


def _restoration(backend: ModelBackend, unit_tokens: torch.Tensor, unit_embedding: torch.Tensor,
                 base: dict[str, torch.Tensor], replaced: dict[str, torch.Tensor], bootstrap: Bootstrap,
                 ) -> list[dict[str, Any]]:
    """Per layer and sub-block, the share of the gap between the replaced and the unreplaced
    position-0 state that its output closes: here, at the last layer, and in the run itself."""
    n_layers = backend.n_layers
    final = n_layers - 1
    post_b = base["resid_post"]
    gap = (replaced["resid_post"] - post_b).norm(dim=-1)
    scale = post_b.norm(dim=-1)  # [layer, unit]

    def closed(after: torch.Tensor, before: torch.Tensor, layer: int | None) -> torch.Tensor:
        """1 - after / before; NaN where there was no gap to close (below round-off of the state's norm;
        ``layer`` None: the gaps are already relative to it)."""
        nothing = before <= _NO_GAP * (scale[layer] if layer is not None else 1.0)
        return torch.where(nothing, torch.full_like(before, float("nan")), 1 - after / before.clamp_min(1e-300))

    # in the run itself the state's norm changes from one sub-block to the next (massive activations grow by
    # orders of magnitude in one MLP): the gap there is taken relative to the unreplaced state's norm
    relative = {name: (replaced[name] - base[name]).norm(dim=-1) / base[name].norm(dim=-1)
                for name in ("resid_pre", "resid_mid", "resid_post")}
    conditions = [(layer, component) for layer in range(n_layers) for component in COMPONENTS]
    patched_post = _run_patched(backend, unit_tokens, unit_embedding,
                                [(f"blocks.{layer}.hook_{component}_out", base[f"{component}_out"][layer])
                                 for layer, component in conditions])
    rows = []
    for (layer, component), patched in zip(conditions, patched_post):
        gap_here = (patched[layer] - post_b[layer]).norm(dim=-1)
        gap_final = (patched[final] - post_b[final]).norm(dim=-1)
        in_run = (closed(relative["resid_mid"][layer], relative["resid_pre"][layer], None) if component == "attn"
                  else closed(relative["resid_post"][layer], relative["resid_mid"][layer], None))
        row: dict[str, Any] = {"layer": layer, "component": component}
        for name, values in (("closed_here", closed(gap_here, gap[layer], layer)),
                             ("closed_final", closed(gap_final, gap[final], final)), ("closed_in_run", in_run)):
            values = values[torch.isfinite(values)]  # units with a gap to close
            if len(values) == 0:
                row[name] = row[f"{name}_lo"] = row[f"{name}_hi"] = float("nan")
                continue
            mean, lo, hi = bootstrap_mean(values.numpy(), bootstrap)
            row[name], row[f"{name}_lo"], row[f"{name}_hi"] = float(mean), float(lo), float(hi)
        rows.append(row)
    return rows


@public
def position0_convergence(
    loaded: LoadedModel,
    prompts: Prompts,
    *,
    replacements: Sequence[str] = REPLACEMENTS,
    n_tokens: int = 3,
    n_random: int = 2,
    tolerance: float = DEFAULT_TOLERANCE,
    seed: int = 0,
    bootstrap: Bootstrap = Bootstrap(),
    progress: bool = True,
) -> Position0Convergence:
    """How far the position-0 state stays from the unreplaced one after its embedding is
    replaced, per layer, the layers where it has converged, and which attention / MLP outputs
    restore it (module docstring).

    Args:
        prompts: the unreplaced runs (a PromptSet or tokens); only their token 0 matters.
        replacements: ``"token"`` (``n_tokens`` tokens drawn with seeds ``seed, seed+1, ...``),
            ``"mean"`` (the mean embedding) and ``"random"`` (``n_random`` directions of the
            replaced embedding's norm).
        tolerance: a layer has converged when the interval of its mean cosine to the unreplaced
            state lies at or above ``1 - tolerance`` (default 0.02).
    """
    prompts = checked_prompts(loaded, prompts, distinct=bootstrap.enabled)
    _check_options(loaded, replacements, tolerance)
    n_tokens, n_random = check_count("n_tokens", n_tokens), check_count("n_random", n_random)
    if n_tokens + n_random > MAX_INSTANCES:  # every replacement runs in one batch with the others
        raise BadInputError(f"n_tokens + n_random = {n_tokens + n_random:,} replacements; at most {MAX_INSTANCES:,} "
                            "run in the one batch this analysis makes: use fewer")
    seed = check_seed(seed)
    backend = loaded.backend
    tokens0 = torch.unique(as_tokens(loaded, prompts)[:, :1].cpu(), dim=0).to(backend.device)
    instances = _instances(loaded, tokens0, replacements, n_tokens, n_random, seed)
    n0, n_inst = len(tokens0), len(instances)
    # one unit per (instance, token 0): the whole batch at once
    unit_tokens = tokens0.repeat(n_inst, 1)
    unit_embedding = torch.cat([vector for _, vector in instances])
    base = {name: value.repeat(1, n_inst, 1) for name, value in _run(backend, tokens0, None).items()}
    replaced = _run(backend, unit_tokens, unit_embedding)
    post_b, post_r = base["resid_post"], replaced["resid_post"]
    cosine = _cosine(post_r, post_b)  # [layer, unit]
    rel_norm = post_r.norm(dim=-1) / post_b.norm(dim=-1)
    distance = (post_r - post_b).norm(dim=-1) / post_b.norm(dim=-1)
    n_layers = backend.n_layers
    per_replacement = pd.DataFrame({
        "replacement": np.tile([label for label, _ in instances for _ in range(n0)], n_layers),
        "token0": np.tile(tokens0[:, 0].cpu().tolist() * n_inst, n_layers),
        "layer": np.repeat(np.arange(n_layers), n0 * n_inst),
        "cosine": cosine.reshape(-1).numpy(), "rel_norm": rel_norm.reshape(-1).numpy(),
        "distance": distance.reshape(-1).numpy(),
    })
    layers = pd.DataFrame({"layer": np.arange(n_layers), "layer_type": list(loaded.spec.layer_types)})
    for name, values in (("cosine", cosine), ("rel_norm", rel_norm), ("distance", distance)):
        mean, lo, hi = bootstrap_mean(values.T.numpy(), bootstrap)
        layers[name], layers[f"{name}_lo"], layers[f"{name}_hi"] = mean, lo, hi
    decided = layers["cosine_lo"].where(layers["cosine_lo"].notna(), layers["cosine"])
    layers["converged"] = decided >= 1 - tolerance
    layers["tolerance"] = tolerance
    converged = layers["converged"].to_numpy()
    first = next((layer for layer in range(n_layers) if converged[layer:].all()), None)
    rows = _restoration(backend, unit_tokens, unit_embedding, base, replaced, bootstrap)
    return Position0Convergence(
        layers=layers, per_replacement=per_replacement, restoration=pd.DataFrame(rows), tolerance=tolerance,
        first_converged_layer=first,
        provenance=provenance.collect(
            model=loaded.spec, data=prompts.spec, seed=seed, replacements=[label for label, _ in instances],
            token0=tokens0[:, 0].cpu().tolist(), tolerance=tolerance, intervals=bootstrap.to_dict("replacement"),
            state="resid_post[l][:, 0] (after block l), one-token sequences: position 0 sees only itself",
            converged="cosine_lo >= 1 - tolerance",
            closed_here="1 - gap after block l with attn_out / mlp_out of block l at position 0 from the unreplaced "
                        "run / gap without the patch",
            closed_final="the same gap at the last layer",
            closed_in_run="1 - gap after the sub-block / gap before it, replaced run, no patch"))
