"""The position-0 fingerprint (claim C5).

Position 0 attends only to itself, so its activation at every layer is a function of the
token at position 0 alone: a closed dynamical system driven by one token. With the same
token 0 in every input (an auto-prepended BOS) the fingerprint is one vector per layer,
identical across inputs up to float noise; with varying token 0 it varies. Attention sinks
pass this fingerprint forward, and sink-reading heads read it; the interventions in
:mod:`lens_position.analyses.sinks` and :mod:`lens_position.analyses.trajectory` replace it by a
*counterfactual* fingerprint, the one another token 0 (or the text without BOS) produces.

Because the fingerprint depends on token 0 only, the counterfactual one is computed from a
one-token run (:func:`position0_activations`): no second full-length run is needed.

:func:`fingerprint` measures, per layer: the spread of ``resid[:, 0]`` across inputs with
auto-BOS (expected: float noise) and with varying token 0, its norm, and its cosine to the
BOS fingerprint.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from jaxtyping import Float, Int

from lens_position.analyses.patching import as_tokens, cache_activations
from lens_position.core.checks import check_count, check_positive
from lens_position.core.data import PromptSet
from lens_position.core.inputs import CheckedPrompts
from lens_position.core.intervals import Estimate
from lens_position.core.results import SavedResult, Table
from lens_position.core.stream import BATCH_SIZE, WholeActivations, stream
from lens_position.core.summaries import Headline
from lens_position.ground import provenance
from lens_position.ground.errors import BadInputError
from lens_position.ground.progress import progress as progress_bar
from lens_position.models.spec import LoadedModel, public


def auto_bos_policy(loaded: LoadedModel) -> str:
    """The ``bos=`` policy that puts the model's BOS token at position 0 of every prompt:
    the tokenizer's own where it prepends BOS (Gemma-3), ``"force"`` where it does not
    (SmolLM2)."""
    return loaded.spec.auto_bos_policy


def counterfactual_token0(
    loaded: LoadedModel, prompts: CheckedPrompts, counterfactual: str
) -> Int[torch.Tensor, "batch"]:
    """The token that sits at position 0 of the counterfactual run, one per prompt.

    - ``"no-bos"``: the same text without BOS, so position 0 holds the first text token
      (``tokens[:, 1]``). The prompts must start with BOS (build them with ``bos="force"``
      or the tokenizer's own BOS where it prepends one).
    - ``"token:<id>"`` (or ``"token:<text>"`` that the tokenizer encodes as one token):
      that token at position 0 of every prompt.
    """
    tokens = prompts.tokens
    if counterfactual == "no-bos":
        has_bos = getattr(prompts, "has_bos", None)
        bos_id = getattr(prompts, "bos_token_id", None) or loaded.spec.bos_token_id
        starts_with_bos = bool((tokens[:, 0] == bos_id).all()) if bos_id is not None else None
        if bos_id is None and not has_bos:
            raise BadInputError(
                "counterfactual='no-bos' removes the BOS at position 0, but the model's BOS token id is "
                "unknown (it has no tokenizer); give it one (as_loaded(model, tokenizer)) or pass prompts "
                "built with build_prompts(model, ..., bos='force')")
        if has_bos is False or starts_with_bos is False:
            raise BadInputError(
                "counterfactual='no-bos' removes the BOS at position 0, but these prompts do "
                "not start with BOS; build them with build_prompts(..., bos='force')"
            )
        if tokens.shape[1] < 2:
            raise BadInputError("counterfactual='no-bos' needs prompts of at least 2 positions")
        return tokens[:, 1].clone()
    if counterfactual.startswith("token:"):
        spec = counterfactual[len("token:"):]
        if spec.lstrip("-").isdigit():
            token = int(spec)
        elif loaded.tokenizer is not None:
            ids = loaded.tokenizer.encode(spec, add_special_tokens=False)
            if len(ids) != 1:
                raise BadInputError(f"{spec!r} is {len(ids)} tokens, not one; pass token:<id>")
            token = ids[0]
        else:
            raise BadInputError(f"the model has no tokenizer to encode {spec!r}; pass token:<id>")
        if not 0 <= token < loaded.backend.d_vocab:
            raise BadInputError(f"counterfactual token {token} is outside the vocabulary")
        if bool((tokens[:, 0] == token).all()):
            raise BadInputError(
                f"every prompt already has token {token} at position 0, so the counterfactual "
                "would change nothing; choose another token"
            )
        return torch.full_like(tokens[:, 0], token)
    raise BadInputError(
        f"unknown counterfactual {counterfactual!r}; use 'no-bos' or 'token:<id>'"
    )


def position0_activations(
    loaded: LoadedModel, token0: Int[torch.Tensor, "batch"], names: Sequence[str]
) -> Any:
    """Activations at position 0 (``[batch, 1, ...]``, in a ``WholeActivations`` reducer) of one-token runs on
    ``token0``: the fingerprint of that token 0 at the hooks in ``names``. Equal to position 0 of any
    longer run with the same token 0 (causal attention), up to float round-off."""
    return cache_activations.body(loaded, token0.reshape(-1, 1), names)


def residual_names(loaded: LoadedModel) -> list[str]:
    """``resid_pre`` of every block, then the last block's ``resid_post`` (layer ``n_layers``)."""
    n_layers = loaded.spec.n_layers
    return [f"blocks.{layer}.hook_resid_pre" for layer in range(n_layers)] + [
        f"blocks.{n_layers - 1}.hook_resid_post"
    ]


@dataclass(repr=False)
class Fingerprint(SavedResult):
    """Result of :func:`fingerprint`.

    ``frame``: one row per (layer, condition); ``layer`` ``l < n_layers`` is
    ``resid_pre[l]``, ``l = n_layers`` the final ``resid_post`` (before the final norm).
    Columns: ``spread`` (RMS over inputs of ``||x_n - mean_n x||``, residual-stream units),
    ``spread_relative`` (spread / ``||mean x||``), ``max_abs_deviation`` (largest
    ``|x_n - mean x|`` entry), ``norm`` (mean over inputs of ``||x_n||``), ``cos_to_bos``
    (mean over inputs of the cosine between ``x_n`` and the mean auto-BOS fingerprint of
    that layer, in [-1, 1]), ``is_float_noise`` (``spread_relative <= noise_tolerance``),
    ``n_distinct_token0``.
    """

    KEYWORD = "fingerprint"
    TABLES = (
        Table("fingerprint", "frame",
              "Fingerprint.frame"),
    )

    frame: pd.DataFrame
    provenance: dict[str, Any]

    WHAT = "the position-0 fingerprint: spread of resid[:, 0] across inputs, per layer and condition"

    def headline(self) -> list[Headline]:
        """Per condition, the largest relative spread over layers (float noise for auto-BOS)."""
        return [Headline("spread_relative", f"largest relative spread ({condition})",
                         Estimate(float(part["spread_relative"].astype(float).max())),
                         "spread / ||mean x||; float noise when all layers are")
                for condition, part in self.frame.groupby("condition", sort=False)]


def _summarise(x: Float[torch.Tensor, "batch d_model"], bos_mean: Float[torch.Tensor, "d_model"]) -> dict:
    x = x.to(torch.float64)
    mean = x.mean(0)
    deviation = x - mean
    spread = deviation.norm(dim=-1).pow(2).mean().sqrt()
    cos = torch.nn.functional.cosine_similarity(x, bos_mean.to(torch.float64)[None], dim=-1)
    return {
        "spread": float(spread),
        "spread_relative": float(spread / mean.norm()) if mean.norm() > 0 else float("nan"),
        "max_abs_deviation": float(deviation.abs().max()),
        "norm": float(x.norm(dim=-1).mean()),
        "cos_to_bos": float(cos.mean()),
    }


def fingerprint_prompts(
    loaded: LoadedModel,
    *,
    T: int = 64,
    N: int = 16,
    seed: int = 0,
    source: str = "natural",
    text: str | None = None,
) -> dict[str, Any]:
    """The two prompt sets of :func:`fingerprint`: ``"auto-bos"`` (policy
    :func:`auto_bos_policy`) and ``"varying-token0"`` (``bos="none"``)."""
    from lens_position.core.data import build_prompts

    policy = auto_bos_policy(loaded)
    return {
        "auto-bos": build_prompts(loaded, source=source, T=T, N=N, bos=policy, seed=seed, text=text),
        "varying-token0": build_prompts(loaded, source=source, T=T, N=N, bos="none", seed=seed, text=text),
    }


def fingerprint_tokens(condition: str, prompts: PromptSet | torch.Tensor) -> Int[torch.Tensor, "batch pos"]:
    """The tokens :func:`fingerprint` streams for a condition: the whole prompts for
    ``"auto-bos"`` (that the rest of the input never reaches position 0 is what this condition
    checks), token 0 alone for ``"varying-token0"``: position 0 attends only to itself, so its
    activations depend on token 0 alone, and this condition's spread is expected, so the rest
    of the prompts would cost a full pass and check nothing (the one-token pass gives the same
    numbers, bit for bit, on the embedded models)."""
    tokens = prompts.tokens if isinstance(prompts, PromptSet) else prompts
    return tokens if condition == "auto-bos" else tokens[:, :1]


def position0_reducer(loaded: LoadedModel) -> WholeActivations:
    """A reducer keeping position 0 of every residual in :func:`residual_names`
    (``result()``: ``{name: Float[Tensor, "batch d_model"]}``), for :func:`fingerprint`."""
    return WholeActivations(residual_names(loaded), select=lambda activation: activation[:, 0])


@public
def fingerprint(
    loaded: LoadedModel,
    *,
    T: int = 64,
    N: int = 16,
    seed: int = 0,
    source: str = "natural",
    text: str | None = None,
    noise_tolerance: float = 1e-5,
    position0: Mapping[str, Mapping[str, torch.Tensor]] | None = None,
    batch_size: int = BATCH_SIZE,
    progress: bool = True,
) -> Fingerprint:
    """Measure the position-0 fingerprint per layer under two conditions:

    - ``"auto-bos"``: every prompt starts with the model's BOS (policy
      :func:`auto_bos_policy`: the tokenizer's own for Gemma-3, ``"force"`` for SmolLM2);
      the fingerprint should be the same vector for every input (float noise).
    - ``"varying-token0"``: the same kind of text without BOS (``bos="none"``), so token 0
      varies across inputs, and so should the fingerprint.

    The auto-BOS prompts are run whole (not as one-token runs), so the check that the rest
    of the input does not reach position 0 is part of the measurement; the varying-token0
    prompts, whose fingerprints are expected to differ, only need their token 0
    (:func:`fingerprint_tokens`). ``position0``: per condition, the :func:`position0_reducer`
    results of :func:`fingerprint_tokens` when already streamed (each prompt set in one
    batch; then no pass is made). ``batch_size``: sequences per forward pass (at most ``N``; the defaults,
    N = batch_size = 16, run each condition in one pass, every row computed alike); at long T, 1 holds
    one sequence's attention at a time (passes of equal shapes, so position 0 is still computed alike).
    ``progress``: one bar, "fingerprint", counting the sequences of both conditions.
    """
    noise_tolerance = check_positive("noise_tolerance", noise_tolerance)  # NaN would call every spread "not noise"
    if check_count("N", N) < 2:  # one input has no spread: "identical across inputs" would hold by construction
        raise BadInputError(f"N = {N}: the fingerprint's spread across inputs needs at least 2 prompts per "
                            "condition; use N >= 2 (default 16)")
    batch_size = check_count("batch_size", batch_size)
    policy = auto_bos_policy(loaded)
    names = residual_names(loaded)
    sets = fingerprint_prompts(loaded, T=T, N=N, seed=seed, source=source, text=text)
    residuals = dict(position0 or {})
    streamed = {condition: prompts for condition, prompts in sets.items() if condition not in residuals}
    with progress_bar("fingerprint", total=sum(len(p.tokens) for p in streamed.values()),
                      enabled=progress and bool(streamed)):
        for condition, prompts in streamed.items():
            reducer = position0_reducer(loaded)
            stream.body(loaded, fingerprint_tokens(condition, as_tokens(loaded, prompts)), [reducer],
                   batch_size=min(batch_size, len(prompts.tokens)), desc=f"fingerprint ({condition})")
            residuals[condition] = reducer.result()
    rows = []
    for layer, name in enumerate(names):
        bos_mean = residuals["auto-bos"][name].mean(0)
        for condition, prompts in sets.items():
            row: dict[str, Any] = {"layer": layer, "condition": condition}
            row.update(_summarise(residuals[condition][name], bos_mean))
            row["is_float_noise"] = bool(row["spread_relative"] <= noise_tolerance)
            row["n_distinct_token0"] = int(prompts.tokens[:, 0].unique().numel())
            rows.append(row)
    frame = pd.DataFrame(rows)
    return Fingerprint(frame=frame, provenance=provenance.collect(
        model=loaded.spec, data={c: p.spec.to_dict() for c, p in sets.items()}, seed=seed,
        bos_policy={"auto-bos": policy, "varying-token0": "none"}, T=T, N=N, source=source,
        noise_tolerance=noise_tolerance, layers="resid_pre[0..L-1], resid_post[L-1]"))
