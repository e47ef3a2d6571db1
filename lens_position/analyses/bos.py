"""BOS replacement (claim C4): how much of the residual component comes from the BOS token.

Before the forward pass, the embedding at position 0 (the BOS token) is replaced with

- ``"token"``: another token's embedding (``token``, default: one drawn with ``seed`` from
  the ordinary vocabulary, never the BOS itself),
- ``"mean"``: the mean embedding over the whole vocabulary,
- ``"random"``: a random Gaussian direction (``seed``) scaled to the norm of the BOS
  embedding,

and the mask/residual decomposition (``lens_position.analyses.decompose``) is rerun on the same
prompts, over early queries (``query_range``, ``i < 32`` by default) and all keys.

**Fraction of R removed.** ``R`` of a head is ``Var(abs t) / Var(log A)`` over the
analysed (prompt, query, key) triples (a fraction of the pattern's variance). Per layer,
``R_base`` and ``R_replaced`` are the means over the layer's heads, and
``fraction_removed = 1 - R_replaced / R_base``; overall, ``R_base`` / ``R_replaced`` are
the means over every head of every layer and ``fraction_removed = 1 - R_replaced / R_base``.
A negative fraction means the replacement *added* residual component. Because the
replacement also changes ``Var(log A)``, the table also gives the raw version on the
unnormalised variance: ``var_abs_t`` (squared nats) summed over heads, and
``fraction_removed_raw = 1 - sum var_abs_t_replaced / sum var_abs_t_base``.
``fraction_removed_rf`` is the same fraction for the reference-free residual component
``R'`` (``R_rf``), in-sample, and ``fraction_removed_rf_heldout`` for its held-out value, the
one claim C4 is decided on. Each fraction is reported only where its base is resolved from 0
(its interval excludes 0, at least :data:`~lens_position.core.intervals.RATIO_FLOOR`): elsewhere
it is NaN ("not defined") and ``<fraction>_resolved`` is False. The paper reports about 40%; we
report what we measure.

**Intervals.** The base and the replaced runs decompose the same prompts, so their bootstrap
replicates resample the same sequences: each fraction's interval (``*_lo``/``*_hi``) comes
from the fraction computed replicate by replicate (a paired bootstrap,
:func:`lens_position.analyses.compare.compare`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from lens_position.analyses.compare import compare, decompose_conditions
from lens_position.analyses.decompose import Decomposition, decompose
from lens_position.analyses.patching import as_tokens, default_replacement_token, embedding_patch
from lens_position.core.checks import check_count, check_query_range, check_seed
from lens_position.core.inputs import Prompts, checked_prompts
from lens_position.core.intervals import Bootstrap
from lens_position.core.results import SavedResult, Table
from lens_position.core.stream import BATCH_SIZE
from lens_position.core.summaries import Headline, headlines_from_rows
from lens_position.ground import provenance
from lens_position.ground.errors import BadInputError
from lens_position.ground.progress import progress as progress_bar
from lens_position.models.spec import LoadedModel, public

REPLACEMENTS = ("token", "mean", "random")


@dataclass(repr=False)
class BosReplacement(SavedResult):
    """Result of :func:`bos_replacement` (module docstring: definitions).

    ``frame``: one row per (replacement, layer): ``replacement``, ``layer``, ``layer_type``,
    ``R_base``, ``R_replaced``, ``fraction_removed``, ``R_heldout_base``,
    ``R_heldout_replaced``, ``var_abs_t_base``, ``var_abs_t_replaced``,
    ``fraction_removed_raw``, ``R_rf_base``, ``R_rf_replaced``, ``fraction_removed_rf`` and the
    intervals ``fraction_removed_lo``/``_hi``, ``fraction_removed_rf_lo``/``_hi``. ``overall``:
    one row per replacement with the same columns over all layers, ``n_sequences`` and the early
    queries ``query_start``/``query_stop``.
    ``heads``: per-head ``R`` base and replaced. ``replicates``: one row per (replacement,
    bootstrap replicate) with the overall fractions (None without intervals).
    ``base_layers`` / ``base_replicates``: the base decomposition's per-layer table and
    replicates (early queries, all keys).
    """

    KEYWORD = "bos"
    TABLES = (
        Table("decompose_early_layers", "base_layers",
              "Decomposition.layers (early queries, all keys)"),
        Table("decompose_early_replicates", "base_replicates",
              "Decomposition.replicates (early queries, all keys)"),
        Table("bos_layers", "frame",
              "BosReplacement.frame"),
        Table("bos_overall", "overall",
              "BosReplacement.overall"),
        Table("bos_replicates", "replicates",
              "BosReplacement.replicates: overall fraction of R removed per bootstrap replicate"),
    )

    frame: pd.DataFrame
    overall: pd.DataFrame
    heads: pd.DataFrame
    provenance: dict[str, Any] = field(default_factory=dict)
    replicates: pd.DataFrame | None = None
    base_layers: pd.DataFrame | None = None
    base_replicates: pd.DataFrame | None = None

    WHAT = "BOS replacement: the share of the residual component R' removed at early queries"
    INTERVALS = "95% paired bootstrap over sequences"

    def headline(self) -> list[Headline]:
        """Per replacement, the fraction of the held-out R' removed over all layers (the estimator
        claim C4 is decided on), with its paired interval; "not defined" where R'_base is not
        resolved from 0."""
        column = "fraction_removed_rf_heldout" if "fraction_removed_rf_heldout" in self.overall.columns \
            else "fraction_removed_rf"
        return headlines_from_rows(self.overall, "replacement", [
            (column, "R' removed (held-out)" if column.endswith("heldout") else "R' removed",
             "1 - R'_replaced / R'_base (negative: added; not defined where R'_base's interval contains 0)")])


@public
def bos_replacement(
    loaded: LoadedModel,
    prompts: Prompts,
    *,
    replacements: Sequence[str] = REPLACEMENTS,
    query_range: tuple[int, int] = (0, 32),
    seed: int = 0,
    token: int | None = None,
    base: Decomposition | None = None,
    batch_size: int = BATCH_SIZE,
    bootstrap: Bootstrap = Bootstrap(),
    progress: bool = True,
) -> BosReplacement:
    """Fraction of the residual component ``R`` removed at early queries when the BOS
    embedding is replaced, per layer and overall, for each replacement.

    ``prompts`` must hold BOS at position 0 (``build_prompts(..., bos="force")`` on
    SmolLM2; Gemma-3's tokenizer prepends it); a bare token tensor must hold the model's
    BOS id at position 0 of every row (taken as given when the model has no BOS id).
    ``base``: the unpatched ``decompose(model, prompts, query_range=query_range)`` when
    already computed (it is then not recomputed). Each replacement is one condition of
    :func:`lens_position.analyses.compare.compare`. ``progress``: one bar, "bos replacement",
    counting the sequences of the base and replaced passes.
    """
    prompts = checked_prompts(loaded, prompts, min_length=2, distinct=bootstrap.enabled)
    seed, batch_size = check_seed(seed), check_count("batch_size", batch_size)
    tokens = as_tokens(loaded, prompts)
    bos_unknown = prompts.spec.source == "tokens" and prompts.bos_token_id is None  # nothing to check against
    if not prompts.has_bos and not bos_unknown:
        raise BadInputError(
            "BOS replacement needs BOS at position 0, but these prompts have none; build "
            "them with build_prompts(..., bos='force') (or the tokenizer's own BOS on Gemma-3)"
        )
    if isinstance(replacements, str):
        replacements = [replacements]
    replacements = list(replacements)
    if not replacements:
        raise BadInputError(f"replacements is empty: there is nothing to replace BOS with; choose one or more of "
                            f"{list(REPLACEMENTS)}")
    if len(set(replacements)) != len(replacements):
        raise BadInputError(f"replacements {replacements} names one twice; name each once")
    unknown = [r for r in replacements if r not in REPLACEMENTS]
    if unknown:
        raise BadInputError(f"unknown replacements {unknown}; choose from {list(REPLACEMENTS)}")
    query_range = check_query_range(query_range, tokens.shape[1])
    if token is None and "token" in replacements:
        token = default_replacement_token.body(loaded, prompts, position=0, seed=seed)
    passes = len(replacements) + (base is None)
    with progress_bar("bos replacement", total=passes * len(tokens), enabled=progress):
        if base is None:
            base = decompose.body(loaded, prompts, query_range=query_range, batch_size=batch_size, bootstrap=bootstrap)
        conditions = {replacement: [embedding_patch.body(loaded, prompts, replacement, position=0, token=token,
                                                    seed=seed)]
                      for replacement in replacements}
        replaced = decompose_conditions.body(loaded, prompts, conditions, query_range=query_range,
                                        batch_size=batch_size, bootstrap=bootstrap)
    comparison = compare(base, replaced)
    names = {"condition": "replacement", "R_condition": "R_replaced", "R_heldout_condition": "R_heldout_replaced",
             "var_abs_t_condition": "var_abs_t_replaced", "R_rf_condition": "R_rf_replaced"}
    heads = comparison.heads.rename(columns=names)[["layer", "head", "layer_type", "replacement", "R_base",
                                                    "R_replaced"]]
    spec = getattr(prompts, "spec", None)
    return BosReplacement(
        frame=comparison.layers.rename(columns=names),
        overall=comparison.overall.rename(columns=names).assign(query_start=query_range[0], query_stop=query_range[1]),
        heads=heads, base_layers=base.layers, base_replicates=base.replicates,
        replicates=None if comparison.replicates is None else comparison.replicates.rename(columns=names),
        provenance=provenance.collect(
            model=loaded.spec, data=spec if spec is not None else {"source": "tensor", "shape": list(tokens.shape)},
            seed=seed, replacements=list(replacements), replacement_token=token, query_range=list(query_range),
            keys="all", bos_policy=getattr(spec, "bos", "as given (token tensor)"),
            position0_token_ids=sorted(set(tokens[:, 0].tolist())),
            fraction_removed=comparison.provenance["fraction_removed"],
            fraction_removed_raw=comparison.provenance["fraction_removed_raw"],
            fraction_removed_rf=comparison.provenance["fraction_removed_rf"],
            intervals={**bootstrap.to_dict("sequence", comparison.provenance["intervals"]["bias_corrected"]),
                       "pairing": comparison.provenance["intervals"]},
        ))
