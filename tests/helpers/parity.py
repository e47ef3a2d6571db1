"""Backend parity, measured: the same prompts through ``hooked`` and ``bridge`` (TransformerLens 3.x,
which has both), and per quantity the largest absolute difference between the two.

The two backends compute the same float32 operations in another order (HF's modules vs
TransformerLens's): activations of O(1-10) differ by a few ulps per block. The statistics are
float64 reductions of those activations, so their differences are of the same relative size.
Each tolerance in :data:`TOLERANCES` is about ten times the largest difference measured on the
tiny models (the generated table in docs/howto/which-transformerlens.md has the numbers), and far
below any difference a verdict could turn on (intervals are ~1e-2 wide). Quantities that are
counts (masked cells, sink heads above ε, verdicts) must agree exactly: tolerance 0.

:func:`measure_parity` is the one measurement: tests/unit/models/test_backend_parity.py asserts
its numbers against :data:`TOLERANCES`, and scripts/parity_table.py writes them into the docs.
"""

from __future__ import annotations

import datetime
import re
import time
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from jaxtyping import Float

BACKENDS = ("hooked", "bridge")

TOLERANCES: dict[str, float] = {
    "logits": 1e-4,
    "attention scores (visible keys)": 1e-4,
    "attention pattern": 1e-5,
    "masked cells that differ (count)": 0.0,
    "decomposition columns (T, R, M, C, both splits, held-out, intervals)": 1e-5,
    "sink scores": 1e-6,
    "sink rate (Gu et al., per condition)": 0.0,
    "BOS replacement (fraction removed, per layer and overall)": 1e-3,  # relative where |fraction| > 1
    "BOS replacement, held-out fraction's interval ends (per unit of interval width)": 5e-4,
    "resid_pre patching sweep (metric)": 2e-5,
    "claim verdicts that differ (count, C1-C5)": 0.0,
}
"""Largest absolute difference allowed between the backends, per quantity (units: those of the
quantity; logits in nats, scores in score units, patterns and fractions in [0, 1])."""

REAL_TOLERANCES: dict[str, float] = {
    "logits": 2e-3,
    "attention scores (visible keys)": 4e-3,
    "attention pattern": 3e-4,
    "masked cells that differ (count)": 0.0,
}
"""The forward quantities' tolerances on the real models at T = 600 (SmolLM2-135M, Gemma-3-270M):
30 and 18 blocks of activations of O(10-100) carry more float32 round-off than the tiny models'
3-6 blocks; about ten times the largest difference measured there (the docs table)."""

SPEC_FIELDS = ("n_layers", "n_heads", "n_kv_heads", "d_model", "d_head", "rope_kind", "rotary_base",
               "rotary_base_local", "window", "layer_types", "tokenizer_prepends_bos", "bos_token_id")
DECOMPOSITION = re.compile(r"^(total|R|M|C|R_rf|M_rf|C_rf)(_heldout)?(_lo|_hi)?$")
SWEEP_POSITIONS = (0, 1, 5)
# The held-out fraction of R' removed is a ratio per bootstrap replicate; a replicate whose held-out
# R' of the base run is near zero magnifies float noise into its interval ends, so those ends are
# compared per unit of the interval's width (the quantity a verdict reads), not absolutely.
HELD_OUT_INTERVAL = ("fraction_removed_rf_heldout_lo", "fraction_removed_rf_heldout_hi")
HELD_OUT_ENDS = "BOS replacement, held-out fraction's interval ends (per unit of interval width)"


@dataclass
class Parity:
    """One measurement: ``differences`` maps each quantity of :data:`TOLERANCES` to the largest
    absolute difference between the backends; ``verdicts`` holds each backend's claim verdicts
    ``{(claim, architecture): verdict}``; ``spec_mismatches`` the spec fields that differ."""

    model: str
    T: int
    N: int
    differences: dict[str, float]
    verdicts: dict[str, dict[tuple[str, str], str]]
    spec_mismatches: list[str]
    seconds: float
    date: str = field(default_factory=lambda: datetime.date.today().isoformat())

    def over_tolerance(self, tolerances: dict[str, float] = TOLERANCES) -> dict[str, tuple[float, float]]:
        """The quantities whose difference exceeds its tolerance: ``{quantity: (measured, tolerance)}``."""
        return {q: (d, tolerances[q]) for q, d in self.differences.items() if not d <= tolerances[q]}


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    # in the tensors' own dtype: a real model's logits in float64 would double the memory, and the
    # difference of two nearby float32 numbers is exact (Sterbenz)
    return float((a - b).abs().max()) if a.numel() else 0.0


def frame_difference(a: pd.DataFrame, b: pd.DataFrame, columns: list[str],
                     relative_above: float | None = None) -> float:
    """Largest absolute difference of ``columns`` between two frames of the same rows (NaN cells,
    e.g. intervals switched off, must be NaN in both); with ``relative_above``, a cell whose
    magnitude exceeds it is compared relative to that magnitude."""
    assert len(a) == len(b) and columns, (len(a), len(b), columns)
    left, right = (f[columns].reset_index(drop=True).astype(float) for f in (a, b))
    assert left.isna().equals(right.isna()), "NaN cells differ"
    difference = (left - right).abs()
    if relative_above is not None:
        difference = difference / left.abs().clip(lower=relative_above)
    return float(difference.max().max()) if len(left) else 0.0


def _forward_differences(models: dict[str, Any], tokens: torch.Tensor, chunk: int = 6) -> dict[str, float]:
    """Logits, visible scores, patterns and masks, one prompt and ``chunk`` layers at a time
    (a real model's T x T patterns of every layer would not fit in memory at once)."""
    out = {"logits": 0.0, "attention scores (visible keys)": 0.0, "attention pattern": 0.0,
           "masked cells that differ (count)": 0.0}
    n_layers = models["hooked"].spec.n_layers
    for i in range(tokens.shape[0]):
        prompt = tokens[i:i + 1]
        with torch.no_grad():
            logits = [models[b].backend.forward(prompt) for b in BACKENDS]
        out["logits"] = max(out["logits"], _max_abs(*logits))
        del logits
        for start in range(0, n_layers, chunk):
            layers = range(start, min(start + chunk, n_layers))
            names = [f"blocks.{layer}.attn.hook_{kind}" for layer in layers for kind in ("attn_scores", "pattern")]
            caches = [models[b].backend.run_with_cache(prompt, names, stop_at_layer=layers[-1] + 1)
                      for b in BACKENDS]
            for name in names:
                hooked, bridged = caches[0][name], caches[1][name]
                visible = torch.isfinite(hooked)
                out["masked cells that differ (count)"] += float((visible != torch.isfinite(bridged)).sum())
                key = "attention pattern" if name.endswith("pattern") else "attention scores (visible keys)"
                both = visible & torch.isfinite(bridged)
                out[key] = max(out[key], _max_abs(hooked[both], bridged[both]))
            del caches
    return out


def _tables(result_frames: dict[str, pd.DataFrame], label: str, role: str) -> dict[str, pd.DataFrame]:
    return {name: frame.assign(architecture=label, role=role) for name, frame in result_frames.items()}


def _sweep_metric(logits: Float[torch.Tensor, "batch pos d_vocab"]) -> torch.Tensor:
    """Mean over prompts of the last position's largest log-probability (nats)."""
    return logits[:, -1].log_softmax(-1).max(-1).values.mean()


FORWARD = ("logits", "attention scores (visible keys)", "attention pattern", "masked cells that differ (count)")


def measure_parity(name: str, *, T: int = 40, N: int = 4, seed: int = 0, n_resamples: int = 200,
                   sweep_layers: list[int] | None = None, batch_size: int = 4, analyses: bool = True) -> Parity:
    """Load ``name`` on both backends, run the same prompts (``N`` natural-text sequences of ``T``
    tokens) through every analysis the parity table lists, and return the largest absolute
    difference per quantity (:data:`TOLERANCES`) and both backends' claim verdicts.

    ``n_resamples`` bootstrap replicates (the same seeded draws on both backends) give the
    intervals; ``sweep_layers`` limits the resid_pre patching sweep (all layers by default) to
    keep a real model's sweep short. ``analyses=False`` measures the forward pass only (the
    quantities in :data:`FORWARD`; no verdicts): a real model's analyses at T > 512 take a
    CPU much longer than its forward pass."""
    from lens_position.analyses.bos import bos_replacement
    from lens_position.analyses.claims import ROLE_NAMES, claims_table
    from lens_position.analyses.decompose import decompose
    from lens_position.analyses.fingerprint import fingerprint
    from lens_position.analyses.patching import resid_pre_sweep
    from lens_position.analyses.sinks import sink_heads, sink_rate
    from lens_position.core.data import build_prompts
    from lens_position.core.intervals import Bootstrap
    from lens_position.models import load_model
    from lens_position.pipeline.steps import STEPS

    started = time.perf_counter()
    bootstrap = Bootstrap(n_resamples=n_resamples)
    models = {b: load_model(name, backend=b) for b in BACKENDS}
    for b in BACKENDS:
        assert models[b].spec.extra["backend"] == b
    mismatches = [f for f in SPEC_FIELDS if getattr(models["hooked"].spec, f) != getattr(models["bridge"].spec, f)]
    prompts = {b: build_prompts(models[b], N=N, T=T, source="natural", seed=seed) for b in BACKENDS}
    assert torch.equal(prompts["hooked"].tokens, prompts["bridge"].tokens), "the backends tokenised differently"
    differences = _forward_differences(models, prompts["hooked"].tokens)
    if not analyses:
        return Parity(model=name, T=T, N=N, differences=differences, verdicts={b: {} for b in BACKENDS},
                      spec_mismatches=mismatches, seconds=time.perf_counter() - started)

    results: dict[str, dict[str, Any]] = {b: {} for b in BACKENDS}
    for b in BACKENDS:
        loaded, p = models[b], prompts[b]
        results[b]["decompose"] = decompose(loaded, p, bootstrap=bootstrap, batch_size=batch_size, progress=False)
        results[b]["sink_heads"] = sink_heads(loaded, p, bootstrap=bootstrap, batch_size=batch_size, progress=False)
        results[b]["sink_rate"] = sink_rate(loaded, T=T, N=N, seed=seed, bootstrap=bootstrap,
                                            batch_size=batch_size, progress=False)
        results[b]["bos"] = bos_replacement(loaded, p, bootstrap=bootstrap, batch_size=batch_size, progress=False)
        results[b]["fingerprint"] = fingerprint(loaded, T=T, N=N, seed=seed, progress=False)
        half = max(1, N // 2)
        results[b]["sweep"] = resid_pre_sweep(loaded, p.tokens[:half], p.tokens[half:2 * half], _sweep_metric,
                                              layers=sweep_layers, positions=list(SWEEP_POSITIONS),
                                              batch_size=batch_size, bootstrap=Bootstrap(n_resamples=0),
                                              progress=False)
    a, b = results["hooked"], results["bridge"]
    key = "decomposition columns (T, R, M, C, both splits, held-out, intervals)"
    differences[key] = 0.0
    for frame in ("heads", "layers"):
        columns = [c for c in getattr(a["decompose"], frame).columns if DECOMPOSITION.match(c)]
        assert {"total", "R_rf", "R_heldout", "M_rf_heldout_lo"} <= set(columns), columns
        differences[key] = max(differences[key], frame_difference(getattr(a["decompose"], frame),
                                                                  getattr(b["decompose"], frame), columns))
    differences["sink scores"] = _max_abs(a["sink_heads"].scores, b["sink_heads"].scores)
    rate = [c for c in a["sink_rate"].frame.columns if c.startswith("sink_rate") or c == "n_sink_heads"]
    differences["sink rate (Gu et al., per condition)"] = frame_difference(a["sink_rate"].frame, b["sink_rate"].frame,
                                                                           rate)
    key, ends = "BOS replacement (fraction removed, per layer and overall)", HELD_OUT_ENDS
    differences[key] = differences[ends] = 0.0
    for frame in ("frame", "overall"):
        left, right = getattr(a["bos"], frame), getattr(b["bos"], frame)
        assert list(left["replacement"]) == list(right["replacement"])
        columns = [c for c in left.columns if c.startswith(("R_base", "R_replaced"))]
        differences[key] = max(differences[key], frame_difference(left, right, columns))
        # a fraction is a ratio: in a layer whose base R' is near zero it reaches hundreds, and float32
        # noise moves it in proportion; compared relative to its size where that exceeds 1
        fractions = [c for c in left.columns if c.startswith("fraction_removed") and c not in HELD_OUT_INTERVAL]
        differences[key] = max(differences[key], frame_difference(left, right, fractions, relative_above=1.0))
        width = (left[HELD_OUT_INTERVAL[1]] - left[HELD_OUT_INTERVAL[0]]).to_numpy(dtype=float)
        for column in HELD_OUT_INTERVAL:
            moved = (left[column] - right[column]).abs().to_numpy(dtype=float) / width
            differences[ends] = max(differences[ends], float(moved.max()) if len(moved) else 0.0)
    differences["resid_pre patching sweep (metric)"] = _max_abs(a["sweep"].values, b["sweep"].values)

    verdicts = {}
    for backend in BACKENDS:
        spec = models[backend].spec
        label = f"{ROLE_NAMES[spec.role]}: {name}"
        tables: dict[str, pd.DataFrame] = {}
        for step, result_name in (("decompose", "decompose"), ("bos", "bos"), ("fingerprint", "fingerprint"),
                                  ("sink_heads", "sink_heads")):
            tables.update(_tables(STEPS[step].frames(results[backend][result_name]), label, spec.role))
        claims = claims_table(tables)
        verdicts[backend] = {(r.claim, r.architecture): r.verdict for r in claims.itertuples()}
    assert verdicts["hooked"].keys() == verdicts["bridge"].keys()
    differences["claim verdicts that differ (count, C1-C5)"] = float(
        sum(verdicts["hooked"][k] != verdicts["bridge"][k] for k in verdicts["hooked"]))
    assert set(differences) == set(TOLERANCES), set(differences) ^ set(TOLERANCES)
    return Parity(model=name, T=T, N=N, differences={q: differences[q] for q in TOLERANCES}, verdicts=verdicts,
                  spec_mismatches=mismatches, seconds=time.perf_counter() - started)


def check_real_model_parity(name: str, table: Any, page: Any) -> None:
    """A real model on both backends at the T of the docs table (beyond Gemma-3's window of 512): the
    same specs, logits, visible scores, patterns and masks within the real-model tolerances, and the
    docs (``page``, its table parsed by ``table``, scripts/parity_table.py) record this model's forward
    pass at the same T and N within a factor of ten."""
    parity = measure_parity(name, **table.REAL_MODELS[name], analyses=False)
    assert parity.spec_mismatches == []
    assert set(parity.differences) == set(FORWARD) == set(REAL_TOLERANCES)
    assert parity.over_tolerance(REAL_TOLERANCES) == {}, parity.over_tolerance(REAL_TOLERANCES)
    _, _, recorded = table.parse_block(page.read_text(encoding="utf-8"))
    row = recorded[name]
    assert (row["T"], row["N"]) == (parity.T, parity.N)
    assert all(table.within_a_factor_of_ten(row["values"][q], d) for q, d in parity.differences.items())
