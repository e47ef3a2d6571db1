"""Hand-made results tables with the columns the experiments return, for plot and report tests.

The numbers are chosen so that each claim's verdict is known in advance: the architectures
"std", "ntk" and "swa" are built so C1-C5 hold, and ``failing=True`` flips C3 and C4.
Bootstrap replicates are the values plus Gaussian noise of standard deviation ``noise``
(small by default, so every interval is far from every threshold).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

ARCHS = (("standard RoPE: std", "standard", "std"), ("NTK-scaled RoPE: ntk", "ntk", "ntk"),
         ("sliding window: swa", "sliding", "swa"))


def _tag(frame: pd.DataFrame, arch: str, role: str, model: str) -> pd.DataFrame:
    frame.insert(0, "architecture", arch)
    frame.insert(1, "role", role)
    frame.insert(2, "model", model)
    return frame


COMPONENTS = ["total", "R", "M", "C", "total_heldout", "R_heldout", "M_heldout", "C_heldout",
              "R_rf", "M_rf", "C_rf", "R_rf_heldout", "M_rf_heldout", "C_rf_heldout"]
N_SEQUENCES = 16
N_REPLICATES = 100


def _with_intervals(frame: pd.DataFrame, columns: list[str], noise: float) -> pd.DataFrame:
    for col in columns:
        frame[f"{col}_lo"] = frame[col] - 2 * noise
        frame[f"{col}_hi"] = frame[col] + 2 * noise
    return frame


def fake_results(n_layers: int = 4, n_heads: int = 3, failing: bool = False,
                 noise: float = 0.002, T: int | dict[str, int] = 128) -> dict[str, pd.DataFrame]:
    """``T``: the sequence length every decomposition records (one value, or one per role: a
    run whose architectures were decomposed at different lengths)."""
    rng = np.random.default_rng(0)
    tables: dict[str, list[pd.DataFrame]] = {}
    for arch, role, model in ARCHS:
        depth = np.arange(n_layers) / (n_layers - 1)
        # Residual share: NTK lowest; sliding window grows with depth (unless failing).
        r_layer = {"standard": 0.10 + 0.02 * depth, "ntk": 0.03 + 0.0 * depth,
                   "sliding": 0.08 + 0.20 * depth}[role]
        if failing and role == "ntk":
            r_layer = 0.30 + 0.0 * depth
        m_layer = 0.30 - 0.05 * depth
        heads = []
        for layer in range(n_layers):
            for head in range(n_heads):
                r = r_layer[layer] * (0.8 + 0.2 * head)
                m = m_layer[layer]
                c = 0.01
                heads.append(dict(layer=layer, head=head, layer_type="global", window=None, total=r + m + c,
                                  R=r, M=m, C=c, total_heldout=r + m + c - 0.01, R_heldout=r - 0.005,
                                  M_heldout=m - 0.005, C_heldout=c, R_rf=r, M_rf=m, C_rf=c,
                                  R_rf_heldout=r - 0.004, M_rf_heldout=m - 0.004, C_rf_heldout=c - 0.002))
        heads = _with_intervals(pd.DataFrame(heads), COMPONENTS, noise)
        layers = heads.groupby("layer", as_index=False)[COMPONENTS].mean()
        layers = _with_intervals(layers, COMPONENTS, noise)
        layers.insert(1, "layer_type", "global")
        layers["relative_depth"] = layers["layer"] / (n_layers - 1)
        layers["n_sequences"] = N_SEQUENCES
        layers["seq_len"] = T[role] if isinstance(T, dict) else T
        replicates = pd.concat([layers[["layer", *COMPONENTS]].assign(
            replicate=b, **{c: layers[c] + rng.normal(0, noise, n_layers) for c in COMPONENTS})
            for b in range(N_REPLICATES)], ignore_index=True)
        early = layers.copy()
        early["query_stop"] = 32
        for col in ("M_rf", "M_rf_heldout", "M", "M_heldout"):
            early[col] = layers[col] * 3
        tables.setdefault("decompose_heads", []).append(_tag(heads, arch, role, model))
        tables.setdefault("decompose_layers", []).append(_tag(layers, arch, role, model))
        tables.setdefault("decompose_replicates", []).append(_tag(replicates, arch, role, model))
        tables.setdefault("decompose_early_layers", []).append(_tag(early, arch, role, model))
        probe = pd.DataFrame(dict(layer=np.arange(n_layers + 1), r2_heldout=np.linspace(0.2, 0.9, n_layers + 1),
                                  r2_shuffled=rng.normal(0, 0.01, n_layers + 1), n_train=100, n_test=100))
        probe = _with_intervals(probe, ["r2_heldout", "r2_shuffled"], noise)
        tables.setdefault("probe_layers", []).append(_tag(probe, arch, role, model))
        base_fraction = 0.9 if failing else 0.4
        bos_rows, overall_rows = [], []
        for k, rep in enumerate(("token", "mean", "random")):
            frac = base_fraction + 0.05 * (k - 1)
            for layer in range(n_layers):
                bos_rows.append(dict(replacement=rep, layer=layer, R_base=r_layer[layer],
                                     R_replaced=r_layer[layer] * (1 - frac), fraction_removed=frac,
                                     fraction_removed_rf=frac))
            overall_rows.append(dict(replacement=rep, R_base=0.1, R_replaced=0.1 * (1 - frac), fraction_removed=frac,
                                     fraction_removed_rf=frac, n_sequences=N_SEQUENCES))
        bos_replicates = pd.DataFrame([dict(replacement=row["replacement"], replicate=b,
                                            fraction_removed=row["fraction_removed"] + rng.normal(0, noise),
                                            fraction_removed_rf=row["fraction_removed_rf"] + rng.normal(0, noise))
                                       for row in overall_rows for b in range(N_REPLICATES)])
        tables.setdefault("bos_layers", []).append(_tag(pd.DataFrame(bos_rows), arch, role, model))
        tables.setdefault("bos_overall", []).append(
            _tag(_with_intervals(pd.DataFrame(overall_rows), ["fraction_removed", "fraction_removed_rf"], noise),
                 arch, role, model))
        tables.setdefault("bos_replicates", []).append(_tag(bos_replicates, arch, role, model))
        fp = []
        for layer in range(n_layers + 1):
            norm = 10.0 + layer
            fp.append(dict(layer=layer, condition="auto-bos", spread=0.0 if layer == 0 else 1e-6, norm=norm,
                           cos_to_bos=1.0))
            fp.append(dict(layer=layer, condition="varying-token0", spread=2.0, norm=norm, cos_to_bos=0.5))
        tables.setdefault("fingerprint", []).append(_tag(pd.DataFrame(fp), arch, role, model))
        sinks = pd.DataFrame([dict(layer=layer, head=head, sink_score=(layer * n_heads + head) / (n_layers * n_heads))
                              for layer in range(n_layers) for head in range(n_heads)])
        sinks["is_sink"] = sinks["sink_score"] > 0.3
        sinks["sink_score_lo"], sinks["sink_score_hi"] = sinks["sink_score"] - 0.01, sinks["sink_score"] + 0.01
        sinks["eps"] = 0.3
        tables.setdefault("sink_heads", []).append(_tag(sinks, arch, role, model))
        reading = sinks[["layer", "head"]].copy()
        reading["output_change"] = np.linspace(1.0, 0.0, len(reading))
        reading["R_change"] = np.linspace(0.1, 0.0, len(reading))
        reading["reading_rank"] = np.arange(1, len(reading) + 1)
        tables.setdefault("sink_reading", []).append(_tag(reading, arch, role, model))
        ablation = pd.DataFrame([dict(ablation=kind, layer=layer, R_before=r_layer[layer],
                                      R_after=r_layer[layer] * 0.5, R_heldout_before=r_layer[layer] - 0.005,
                                      R_heldout_after=r_layer[layer] * 0.5 - 0.005) for kind in ("zero", "mean")
                                 for layer in range(n_layers)])
        for prefix in ("R", "R_heldout"):
            ablation[f"{prefix}_change"] = ablation[f"{prefix}_after"] - ablation[f"{prefix}_before"]
        ablation = _with_intervals(ablation, ["R_change", "R_heldout_change"], noise)
        tables.setdefault("sink_ablation", []).append(_tag(ablation, arch, role, model))
        rate = pd.DataFrame(dict(condition=["natural", "random", "repeated"], sink_rate=[0.6, 0.5, 0.2],
                                 sink_rate_lo=[0.55, 0.45, 0.15], sink_rate_hi=[0.65, 0.55, 0.25],
                                 sink_rate_pooled=[0.65, 0.55, 0.3], eps=0.3, seq_len=64, N=4))
        tables.setdefault("sink_rate", []).append(_tag(rate, arch, role, model))
    return {k: pd.concat(v, ignore_index=True) for k, v in tables.items()}


def with_length_sweep(tables: dict[str, pd.DataFrame], lengths: dict[str, tuple[int, ...]],
                      window: dict[str, int] | None = None) -> dict[str, pd.DataFrame]:
    """``tables`` with length-sweep tables: each architecture's decomposition repeated at each of
    its ``lengths`` (keyed by role), and its sliding ``window`` (by role) in the ``length_sweep``
    table and the per-head table."""
    window = window or {}
    out = dict(tables)
    layers, replicates, by_length = [], [], []
    for (_, role), part in tables["decompose_layers"].groupby(["architecture", "role"], sort=False):
        reps = tables["decompose_replicates"][tables["decompose_replicates"]["role"] == role]
        for T in lengths.get(role, ()):
            layers.append(part.assign(seq_len=T))
            replicates.append(reps.assign(seq_len=T))
            by_length.append(part[["architecture", "role", "model"]].iloc[:1].assign(
                seq_len=T, quantity="M_rf_heldout", value=float(part["M_rf_heldout"].mean()),
                window=float(window[role]) if role in window else np.nan))
    if layers:
        out["length_sweep_layers"] = pd.concat(layers, ignore_index=True)
        out["length_sweep_replicates"] = pd.concat(replicates, ignore_index=True)
        out["length_sweep"] = pd.concat(by_length, ignore_index=True)
    heads = out["decompose_heads"].copy()
    for role, w in window.items():
        local = (heads["role"] == role) & (heads["layer"] % 2 == 0)
        heads["window"] = heads["window"].astype("object")
        heads.loc[local, "layer_type"], heads.loc[local, "window"] = "local", w
    out["decompose_heads"] = heads
    return out
