"""Every column of every result table, with what it means: one registry, read by the docs
(``docs/hooks/columns.py`` renders it into the column reference), by the result summaries
and by :func:`recommended_first`, which puts the numbers the claims are decided on first.

**The recommended numbers.** The claims (``lens_position.analyses.claims``) are decided on the
*held-out*, *reference-free* split: ``R_rf_heldout`` (R', the residual stream's share of the
attention's absolute-position signal) and ``M_rf_heldout`` (M', the causal mask's share), with
``total_heldout`` beside them and, for BOS replacement, ``fraction_removed_rf``. Every main
table starts with these and their intervals; the other variants (in-sample, self-referenced)
follow under names that say which they are:

- no suffix (``R``, ``M``, ``C``, ``total``): in-sample, self-referenced (``t = s - s[i,i]``);
- ``_heldout``: fitted on one half of the sequences, evaluated on the other;
- ``_rf``: the reference-free split (mask-only counterfactual), independent of the reference;
- ``_lo`` / ``_hi``: the bootstrap interval of the column without the suffix (95% unless the
  result's provenance says otherwise).

A column is never named like a pandas attribute (``T`` is ``DataFrame.T``, the transpose),
except ``head``, the head index as TransformerLens names it: read it as ``frame["head"]``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pandas as pd

# what identifies a row, in the order a table shows them
IDENTITY = ("condition", "replacement", "ablation", "patch_layer", "set", "claim", "quantity", "layer", "head",
            "position", "layer_type")

# the numbers the claims are decided on, in the order a table shows them
RECOMMENDED = ("R_rf_heldout", "M_rf_heldout", "total_heldout", "C_rf_heldout", "fraction_removed_rf",
               "R_rf_change", "sink_score", "is_sink", "sink_rate", "r2_heldout", "output_change", "R_change",
               "pattern_change", "spread_relative", "is_float_noise", "value", "sd_ratio")

_SPLIT = {"": "in-sample, self-referenced split (t = s - s[i,i])",
          "_heldout": "held out (fitted on one half of the sequences, evaluated on the other), self-referenced split",
          "_rf": "in-sample, reference-free split (mask-only counterfactual)",
          "_rf_heldout": "held out, reference-free split: the one the claims use"}
_COMPONENT = {"total": "total absolute-position signal of log A",
              "R": "residual component (absolute position the residual stream puts into the scores)",
              "M": "mask component (absolute position the causal softmax normaliser adds)",
              "C": "interaction of the residual and mask components"}


def _components() -> dict[str, str]:
    out = {}
    for name, what in _COMPONENT.items():
        for suffix, split in _SPLIT.items():
            if name == "total" and suffix.startswith("_rf"):
                continue  # the total is the same in both splits
            out[f"{name}{suffix}"] = f"{what}, {split}; fraction of Var(log A)"
    return out


COLUMNS: dict[str, str] = {
    # identity and options
    "layer": "layer index, as in the model (0 = the first block; for fingerprints n_layers = the final resid_post)",
    "head": "head index within the layer, as in the model",
    "layer_type": '"global" (causal over every earlier key) or "local" (sliding window)',
    "window": "the layer's sliding-window size in keys (empty for a causal layer)",
    "query_start": "first analysed query position (inclusive)",
    "query_stop": "end of the analysed query positions (exclusive)",
    "key_set": '"all" keys, or "no-bos": every key but position 0',
    "relative_depth": "layer / (n_layers - 1), in [0, 1]",
    "n_pairs": "analysed (sequence, query, key) triples",
    "n_sequences": "sequences the row rests on (the unit the bootstrap resamples)",
    "replicate": "bootstrap replicate index",
    "condition": "the input condition or compared run the row belongs to",
    "architecture": "the model's label in a reproduction",
    "role": 'the model\'s architecture role (ModelSpec.role): "standard", "ntk", "sliding"; "interpolated" '
            '(linear RoPE position interpolation) and "no-rope" are outside C3\'s comparison',
    "model": "the model's registry name or source",
    # decomposition
    **_components(),
    "var_logA": "Var(log A) over the analysed triples, squared nats (the denominator of every component)",
    "var_abs_t": "Var(abs(t)): variance of the absolute part of the self-referenced scores, squared nats",
    "var_abs_z": "Var(abs(z)): variance of the absolute part of the log-normaliser, squared nats",
    "cov_abs_tz": "Cov(abs(t), abs(z)), squared nats",
    # BOS replacement and comparisons
    "replacement": 'what replaced the BOS embedding: "token", "mean" (vocabulary mean) or "random" (same norm)',
    "R_base": "residual component R of the unpatched (base) run, fraction of Var(log A)",
    "R_replaced": "R with the BOS embedding replaced",
    "R_condition": "R in the compared condition",
    "R_patched": "R with the patch applied",
    "R_change": "change in R: patched (or replaced, ablated, condition) minus base",
    "R_heldout_base": "held-out R of the base run",
    "R_heldout_replaced": "held-out R with the BOS embedding replaced",
    "R_heldout_condition": "held-out R in the compared condition",
    "R_heldout_change": "change in held-out R",
    "R_rf_base": "reference-free R' of the base run (in-sample)",
    "R_rf_replaced": "reference-free R' with the BOS embedding replaced (in-sample)",
    "R_rf_condition": "reference-free R' in the compared condition (in-sample)",
    "R_rf_change": "change in the reference-free R' (in-sample)",
    "var_abs_t_base": "Var(abs(t)) of the base run, squared nats",
    "var_abs_t_replaced": "Var(abs(t)) with the BOS embedding replaced, squared nats",
    "var_abs_t_condition": "Var(abs(t)) in the compared condition, squared nats",
    "fraction_removed": "1 - R_replaced / R_base: share of the self-referenced R removed (negative: added)",
    "fraction_removed_raw": "1 - var_abs_t_replaced / var_abs_t_base: share of Var(abs(t)) removed, unnormalised",
    "fraction_removed_rf": "1 - R'_replaced / R'_base: share of the reference-free R' removed, in-sample",
    "fraction_removed_rf_heldout": "1 - R'_replaced / R'_base on held-out R': share of the reference-free R' "
                                   "removed (what C4 is decided on: it does not drift with N)",
    "fraction_removed_resolved": "whether R_base is resolved from 0 (interval excludes 0, at least 0.005): "
                                 "fraction_removed is NaN (not defined) where not",
    "fraction_removed_rf_resolved": "whether R'_base (in-sample) is resolved from 0: fraction_removed_rf is NaN "
                                    "(not defined) where not",
    "fraction_removed_rf_heldout_resolved": "whether the held-out R'_base is resolved from 0 (interval excludes 0, "
                                            "at least 0.005): fraction_removed_rf_heldout is NaN (not defined) "
                                            "where not",
    "R_rf_heldout_base": "held-out reference-free R' of the base run, fraction of Var(log A)",
    "R_rf_heldout_condition": "held-out reference-free R' in the compared condition, fraction of Var(log A)",
    "metric": "the patching metric (the user's function of the logits) with that cell patched, mean over prompts",
    # sinks
    "sink_score": "mean attention on position 0 over prompts and queries, in [0, 1]",
    "is_sink": "sink_score > eps: a sink head (Gu et al. 2024)",
    "eps": "the sink threshold on attention to position 0",
    "sink_rate": "Gu et al.'s sink rate: fraction of (prompt, layer, head) triples whose score exceeds eps",
    "sink_rate_pooled": "fraction of heads whose score averaged over prompts exceeds eps (not Gu et al.'s metric)",
    "seq_len": "positions per prompt",
    "N": "prompts",
    "bos": "the BOS policy of the prompts",
    "protocol": 'how sink-rate prompts were drawn: "windows" or "documents"',
    "position0": "what sits at position 0 of the prompts",
    "n_sink_heads": "heads whose score averaged over prompts exceeds eps",
    "n_heads": "heads in the model (layers x heads per layer)",
    "output_change": "RMS change of the head's output z when its own position-0 key/value is patched, "
                     "relative to the RMS of z (0 = no change)",
    "reading_rank": "1 = the head whose R changes most when its own position-0 key/value is patched",
    "ablation": 'how the top sink-reading heads were ablated: "zero" (z = 0) or "mean" (z = its mean)',
    "ablated": "whether this head was among the ablated ones",
    "R_before": "mean R over the layer's heads before the ablation",
    "R_after": "mean R over the layer's heads with the top sink-reading heads ablated",
    "R_heldout_before": "held-out R before the ablation",
    "R_heldout_after": "held-out R after the ablation",
    # probes
    "r2_heldout": "R² of the ridge probe resid_pre -> log(i+1) on held-out sequences (at most 1)",
    "r2_train": "R² of the probe on its training sequences",
    "r2_shuffled": "held-out R² of a probe trained on shuffled positions (the chance level)",
    "ridge": "the ridge penalty used",
    "n_train": "training rows (sequences x positions)",
    "n_test": "held-out rows (sequences x positions)",
    # fingerprints
    "spread": "RMS over inputs of ||x_n - mean x|| of resid[:, 0], residual-stream units",
    "spread_relative": "spread / ||mean x||, dimensionless",
    "max_abs_deviation": "largest |x_n - mean x| entry, residual-stream units",
    "norm": "mean over inputs of ||x_n||, residual-stream units",
    "cos_to_bos": "mean cosine between x_n and the mean auto-BOS fingerprint of the layer, in [-1, 1]",
    "is_float_noise": "spread_relative <= the noise tolerance: identical up to float round-off",
    "n_distinct_token0": "distinct tokens at position 0 among the inputs",
    # positional leakage (the measure of Ruscio et al., "Once upon a token")
    "delta_r2": "positional leakage ΔR² = R²(rel + src + tgt) - R²(rel) of the unscaled post-RoPE scores over the "
                "causal pairs (held out over 30% of the pairs), mean over the texts; unitless, in [-1, 1]",
    "delta_r2_null": "ΔR² on the texts' circularly shifted tokens (the null), mean over the texts",
    "r2_relative": "held-out R² of the scores on the offset i - j alone (with an intercept), mean over the texts",
    "r2_full": "held-out R² of the scores on offset, query and key position (with an intercept), mean over the texts",
    "leakage_gap": "delta_r2 - delta_r2_null: ΔR² on the texts beyond their shifted nulls (unitless)",
    "p_value": "one-sided sign-flip p-value of leakage_gap > 0 over the texts",
    "q_value": "the multiple-comparison q-value over all heads: Benjamini-Hochberg (corrected mode) or the authors' "
               "step as written (authors mode)",
    "significant": "q_value <= alpha (the false discovery rate asked for)",
    "significant_share": "share of the seeds in which the head was significant (corrected mode)",
    "n_significant": "significant heads in the layer",
    "band": 'a RoPE frequency band: "band k" (the model\'s own pairs, k = 0 the fastest; "unrotated" for '
            'dimensions RoPE leaves alone) or the authors\' "bk" (ten runs of pairs taken as dimensions 2p, 2p+1)',
    "band_index": "the band's position in frequency order (0 = the fastest)",
    "energy_share": "the band's share of the Frobenius norm of the head's score matrix (sum over bands = 1)",
    "definition": 'the published sink definition a row follows ("gu", "barbero", "first_token_mass", "eviction")',
    "loss_dense": "next-token loss with dense attention, mean over the evaluated positions (nats per token)",
    "loss_window": "next-token loss when every query sees only the last `window` keys (nats per token)",
    "loss_window_sinks": "next-token loss with the last `window` keys and the first `sinks` keys (nats per token)",
    "first_token_mass": "mean attention on key 0 over layers, heads and queries 1..T-1, a fraction in [0, 1]",
    "share_significant": "n_significant / n_heads",
    "top_head": "the head with the largest leakage_gap, as L<layer>H<head>",
    "mode": 'how positional leakage was tested: "authors" (their notebook) or "corrected"',
    "n_samples": "texts (each with its shifted null) the test rests on",
    "seed_a": "the first seed of the pair compared",
    "seed_b": "the second seed of the pair compared",
    "n_significant_a": "significant heads under seed_a",
    "n_significant_b": "significant heads under seed_b",
    "jaccard": "overlap of the two seeds' significant sets, |A ∩ B| / |A ∪ B| (1 when both are empty)",
    # sink origin
    "location": 'where a sink score is read: "position0" (key 0), "bos" (the BOS token(s) wherever they are) or '
                '"first_delimiter" (the first punctuation or newline token after position 0)',
    "key_positions": "the key positions a location covers (a position, a list, or a range over prompts; none: absent)",
    "n_prompts": "prompts that entered the row (where the location exists; where the entry was massive)",
    "kept": "share of the with-BOS sink rate at position 0 kept without BOS (paired over the same texts)",
    "followed": "share of the with-BOS sink rate at position 0 found at a BOS moved to a later position",
    "reason": "the verdict in words, with the numbers it was decided on",
    # massive activations
    "top1": "largest |resid_post| entry of the layer over positions and dimensions (residual-stream units), "
            "mean over prompts",
    "top2": "second largest |resid_post| entry of the layer, mean over prompts",
    "top3": "third largest |resid_post| entry of the layer, mean over prompts",
    "median_abs": "median |resid_post| entry of the layer, mean over prompts",
    "ratio": "top1 over the median |resid_post| (Sun et al.'s massive activations reach about 1000x and more)",
    "top1_position": "the position of the largest entry in most prompts",
    "top1_dim": "the residual dimension of the largest entry in most prompts",
    "n_massive": "massive entries (|h| >= min_magnitude and >= min_ratio x median) per prompt, mean",
    "share_massive": "fraction of prompts whose layer output holds a massive entry",
    "dim": "a residual-stream dimension",
    "share": "fraction of prompts in which the entry is massive",
    "mean_value": "mean signed value of the entry where it is massive (residual-stream units)",
    "magnitude": "mean |value| of the entry where it is massive (residual-stream units)",
    "attention_on_massive": "attention on the positions massive in the layer's input, summed over them and "
                            "averaged over the queries that see them, in [0, 1]",
    "is_reader": "attention_on_massive > eps: a head reading the massive positions",
    "intervention": 'the intervention on the massive entries: "set_zero" or "set_mean" (Sun et al.)',
    "entries": "the (position, dim) entries the intervention set",
    "fill": "the values the entries were set to, in order",
    "sink_rate_base": "Gu et al.'s sink rate at position 0 without the intervention",
    "sink_rate_change": "sink rate with the intervention minus without, paired over prompts",
    "R_rf": "R' (reference-free residual component, in sample) with the intervention",
    "loss": "next-token loss with the intervention, nats per token (mean over prompts and positions)",
    "loss_base": "next-token loss without the intervention, nats per token",
    "loss_change": "loss with the intervention minus without, paired over prompts (nats per token)",
    # trajectory patching
    "patch_layer": "the layer whose resid_pre[:, 0] was patched",
    "pattern_change": "mean |A_patched - A_base| of the head's pattern over analysed queries (probability units)",
    # patching sweeps
    "position": "a position in the sequence: the patched one, or the one holding a massive entry",
    # prompt sets
    "set": "the prompt set (1..K)",
    "claim": "the claim the quantity decides (C1..C5)",
    "quantity": "the column of the decomposition measured (on each prompt set, or at each length T)",
    "label": "the quantity in words",
    "value": "the quantity on this set or at this length (mean over layers and heads)",
    "beyond_window": "whether T exceeds the model's sliding window (its local layers slide)",
    # C3 at each length (claims_by_length.csv)
    "versus": "the standard-RoPE model a comparison is made against (empty: the model's own quantity)",
    "source": "where the row's decompositions come from: the models' own decompositions or their length sweeps",
    "lo": "lower end of the value's bootstrap interval",
    "hi": "upper end of the value's bootstrap interval",
    "level": "the interval's confidence level",
    "verdict": "the claim's verdict on this set; for a sink origin, where the sink comes from: position-driven, "
               "BOS-driven, mixed, none or inconclusive",
    "n_sets": "number of disjoint prompt sets K",
    "mean_over_sets": "mean of the quantity over the K sets",
    "between_sd": "standard deviation of the K estimates",
    "bootstrap_sd": "the standard deviation each set's bootstrap interval predicts (width / 3.92)",
    "sd_ratio": "between_sd / bootstrap_sd (1 = the bootstrap is as wide as the spread between sets)",
    "min_over_sets": "smallest of the K estimates",
    "max_over_sets": "largest of the K estimates",
    "verdicts": 'verdicts over the sets, e.g. "holds 4/4"',
}

# columns whose name is a pandas attribute and that keep it (module docstring)
PANDAS_NAME_EXCEPTIONS = frozenset({"head"})


def describe(column: str, declared: Mapping[str, str] | None = None) -> str | None:
    """What ``column`` means (None if neither the registry nor ``declared``, a table's own columns,
    knows it); ``X_lo``/``X_hi`` are the interval of ``X``."""
    known = {**COLUMNS, **(declared or {})}
    if column in known:
        return known[column]
    for side, which in (("_lo", "lower"), ("_hi", "upper")):
        if column.endswith(side) and column[: -len(side)] in known:
            return f"{which} end of the bootstrap interval of {column[: -len(side)]}"
    return None


def undocumented(columns: Iterable[str], declared: Mapping[str, str] | None = None) -> list[str]:
    """The columns neither the registry nor ``declared`` (a table's own columns) describes."""
    return [c for c in columns if describe(c, declared) is None]


def display_order(columns: Iterable[str]) -> list[str]:
    """``columns`` in the order :func:`recommended_first` gives a table's columns."""
    columns = list(columns)
    head = [c for c in IDENTITY if c in columns]
    for c in RECOMMENDED:
        if c in columns:
            head += [c] + [f"{c}{s}" for s in ("_lo", "_hi") if f"{c}{s}" in columns]
    seen = set(head)
    return head + [c for c in columns if c not in seen]


def recommended_first(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with its columns reordered: what identifies a row, then the recommended numbers
    (module docstring), each followed by its interval, then every other column in its order."""
    return frame[display_order(frame.columns)]
