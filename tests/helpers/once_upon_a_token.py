"""Test-only reference: the positional-leakage computation of the notebook ``once_upon_a_token.ipynb``
(repository ValeRuscio/Once_upon_a_token, commit b36ff32), re-written step by step in the same
operations and the same order of random draws, so that lens_position's ``mode="authors"`` can be
compared with it on the same inputs.

What is replaced, and only that:
- the model: the notebook loads Llama-3.2-1B from the hub; here ``forward(ids)`` is whatever runs a
  model on ``[1, T]`` ids and fills ``TRACE`` (the notebook's dict ``layer -> [{"q_rot", "k_rot"}]``,
  each ``[batch, heads, seq, head_dim]``). Two are provided: their own hook (``apply_rotary_pos_emb``
  wrapped in the Hugging Face module, the layer set by pre/post hooks on ``self_attn``) on a Hugging
  Face model, and lens_position's hooks (``hook_rot_q``/``hook_rot_k``) on a loaded model;
- the wrapper no longer forwards ``position_ids`` to ``apply_rotary_pos_emb`` (transformers 5 removed
  that argument); the module is not reloaded (the notebook reloads it to undo an earlier patch);
- the least-squares fits take the notebook's own fallback (``np.linalg.lstsq``), not scikit-learn,
  which solves the same problem with the same LAPACK driver;
- the texts: the notebook's CSV has no licence, so the caller passes its own.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import torch

TRACE: dict[int, list[dict[str, torch.Tensor]]] = {}


# ---- the notebook's hooks (cell 7), on a Hugging Face Llama -----------------------------------


@contextlib.contextmanager
def notebook_hooks(hf_model):
    """Their capture: ``apply_rotary_pos_emb`` wrapped to store the rotated q and k of the current
    layer, the layer set by a forward pre-hook on each ``self_attn`` and cleared by a forward hook."""
    import transformers.models.llama.modeling_llama as modeling_llama

    original = modeling_llama.apply_rotary_pos_emb
    current = {"layer": None}

    def rope_wrapper(q, k, cos, sin, unsqueeze_dim=1):
        q_rot, k_rot = original(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
        if current["layer"] is not None:
            TRACE.setdefault(current["layer"], []).append({"q_rot": q_rot.detach().to("cpu"),
                                                           "k_rot": k_rot.detach().to("cpu")})
        return q_rot, k_rot

    handles = []
    for i, block in enumerate(hf_model.model.layers):
        def pre(module, inputs, i=i):
            current["layer"] = i

        def post(module, inputs, outputs):
            current["layer"] = None

        handles += [block.self_attn.register_forward_pre_hook(pre), block.self_attn.register_forward_hook(post)]
    modeling_llama.apply_rotary_pos_emb = rope_wrapper
    try:
        yield lambda ids: hf_model(input_ids=ids, use_cache=False)
    finally:
        modeling_llama.apply_rotary_pos_emb = original
        for handle in handles:
            handle.remove()


def lens_position_forward(loaded):
    """Fill ``TRACE`` from a lens_position model's ``hook_rot_q``/``hook_rot_k`` (the same hooks
    ``positional_leakage`` reads), in the notebook's layout ``[batch, heads, seq, head_dim]``."""
    hooks = {layer: [f"blocks.{layer}.attn.{name}" for name in loaded.backend.rotary_layout(layer).query_hooks]
             for layer in range(loaded.spec.n_layers)}
    names = {name for pair in hooks.values() for name in pair}

    def forward(ids):
        with torch.no_grad():
            _, cache = loaded.backend.model.run_with_cache(ids, names_filter=lambda name: name in names)
        for layer, (q_name, k_name) in hooks.items():
            TRACE.setdefault(layer, []).append({"q_rot": cache[q_name].transpose(1, 2).detach().cpu(),
                                                "k_rot": cache[k_name].transpose(1, 2).detach().cpu()})
    return forward


# ---- cell 5: RoPE band masks --------------------------------------------------------------------


def rope_inv_freq_pairs(num_pairs, base=10000.0):
    i = torch.arange(0, num_pairs, dtype=torch.float32)
    return 1.0 / (base ** (i / num_pairs))


def rope_band_masks(rotary_dim, bands, base=10000.0):
    num_pairs_rot = rotary_dim // 2
    inv = rope_inv_freq_pairs(num_pairs_rot, base=base)
    order = torch.argsort(inv, descending=True)
    masks = {}
    total_pairs = num_pairs_rot
    total_frac = sum(max(0.0, float(f)) for f in bands.values()) or 1.0
    start = 0
    for name, frac in bands.items():
        cnt = int(round((max(0.0, float(frac)) / total_frac) * total_pairs))
        end = min(start + cnt, total_pairs)
        pm = torch.zeros(num_pairs_rot, dtype=torch.bool)
        if end > start:
            pm[order[start:end]] = True
        masks[name] = pm
        start = end
    if start < total_pairs and masks:
        last = list(bands.keys())[-1]
        pm = masks[last].clone()
        pm[order[start:total_pairs]] = True
        masks[last] = pm
    return masks


def pair_indices_to_dim_mask(pair_mask, head_dim, rotary_dim):
    dim_mask = torch.zeros(head_dim, dtype=torch.bool)
    for p in torch.nonzero(pair_mask, as_tuple=False).flatten().tolist():
        d0, d1 = 2 * p, 2 * p + 1
        if d1 < rotary_dim:
            dim_mask[d0] = True
            dim_mask[d1] = True
    return dim_mask


# ---- cells 18, 20, 21: heads, band shares -------------------------------------------------------


def safe_sanitize_tensor(x):
    return torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)


def get_layer_head_mats(layer_idx):
    entries = TRACE.get(layer_idx)
    if not entries:
        return []
    q, k = entries[-1]["q_rot"], entries[-1]["k_rot"]
    _, n_heads, seq, _ = q.shape
    k_exp = k if k.shape[1] == n_heads else k.repeat_interleave(n_heads // k.shape[1], dim=1)
    return [(safe_sanitize_tensor(q[0, h, :seq, :].contiguous()),
             safe_sanitize_tensor(k_exp[0, h, :seq, :].contiguous())) for h in range(n_heads)]


def band_contributions(Q, K, band_dim_mask):
    Qb = safe_sanitize_tensor(Q[:, band_dim_mask])
    Kb = safe_sanitize_tensor(K[:, band_dim_mask])
    if Qb.numel() == 0:
        return Q.new_zeros((Q.shape[0], Q.shape[0]))
    return (Qb @ Kb.T).to(torch.float32)


def safe_band_shares_map(energy_map):
    total = sum(v for v in energy_map.values() if math.isfinite(v) and v >= 0.0)
    if total <= 0.0:
        return {k: 0.0 for k in energy_map}
    return {k: float(max(v, 0.0) / total) if math.isfinite(v) else 0.0 for k, v in energy_map.items()}


def band_shares(n_layers, rotary_dim, bands=None):
    """Step 7's ``band_share_fro`` of every head on the last capture: ``{layer: [{band: share}]}``."""
    bands = bands or {f"b{i}": 0.1 for i in range(10)}
    out = {}
    for li in range(n_layers):
        heads = get_layer_head_mats(li)
        hd = heads[0][0].shape[1]
        dim_masks = {name: pair_indices_to_dim_mask(pm, hd, rotary_dim)
                     for name, pm in rope_band_masks(rotary_dim, bands).items()}
        layer_out = []
        for Q, K in heads:
            Qf, Kf = Q.to(torch.float32), K.to(torch.float32)
            energy = {name: float(torch.nan_to_num(torch.norm(safe_sanitize_tensor(band_contributions(Qf, Kf, dm)),
                                                              p="fro"), nan=0.0, posinf=0.0, neginf=0.0))
                      for name, dm in dim_masks.items()}
            layer_out.append(safe_band_shares_map(energy))
        out[li] = layer_out
    return out


# ---- cell 23: leakage with held-out pairs, null, bootstrap, permutation, "BH" -------------------


def _build_design_train_test(seq, test_frac, rng):
    I, J = torch.tril_indices(row=seq, col=seq, offset=0)
    N = I.numel()
    idx = np.arange(N)
    rng.shuffle(idx)
    t = int(round((1.0 - test_frac) * N))

    def _mk_subset(sub):
        Ii, Jj = I[sub], J[sub]
        rel = (Ii - Jj).to(torch.float64).unsqueeze(1).cpu().numpy()
        src = Ii.to(torch.float64).unsqueeze(1).cpu().numpy()
        tgt = Jj.to(torch.float64).unsqueeze(1).cpu().numpy()
        ones = np.ones_like(rel, dtype=np.float64)
        rel -= rel.mean(0, keepdims=True)
        src -= src.mean(0, keepdims=True)
        tgt -= tgt.mean(0, keepdims=True)
        return Ii, Jj, rel, src, tgt, ones

    return _mk_subset(idx[:t]), _mk_subset(idx[t:])


def _r2_from_design_test(X_tr, y_tr, X_te, y_te):
    beta, *_ = np.linalg.lstsq(X_tr, y_tr, rcond=None)
    y_pred = (X_te @ beta).astype(np.float64, copy=False)
    y_te = np.asarray(y_te, dtype=np.float64).ravel()
    y_pred = np.asarray(y_pred, dtype=np.float64).ravel()
    ss_res = float(np.sum((y_te - y_pred) ** 2, dtype=np.float64))
    y_mean = float(np.mean(y_te, dtype=np.float64))
    ss_tot = float(np.sum((y_te - y_mean) ** 2, dtype=np.float64)) + 1e-12
    return float(1.0 - (ss_res / ss_tot))


def _compute_leakage_for_current_capture_cv(n_layers, test_frac, rng):
    out = {}
    with torch.no_grad():
        for li in range(n_layers):
            mats = get_layer_head_mats(li)
            if not mats:
                continue
            seq = mats[0][0].shape[0]
            (I_tr, J_tr, rel_tr, src_tr, tgt_tr, ones_tr), (I_te, J_te, rel_te, src_te, tgt_te, ones_te) = \
                _build_design_train_test(seq, test_frac, rng)
            rows = []
            for hi, (Q, K) in enumerate(mats):
                logits = Q.to(torch.float32) @ K.to(torch.float32).T
                y_tr = np.nan_to_num(logits[I_tr, J_tr].to(torch.float64).cpu().numpy().reshape(-1, 1))
                y_te = np.nan_to_num(logits[I_te, J_te].to(torch.float64).cpu().numpy().reshape(-1, 1))
                R2_rel = _r2_from_design_test(np.concatenate([rel_tr, ones_tr], 1), y_tr,
                                              np.concatenate([rel_te, ones_te], 1), y_te)
                R2_full = _r2_from_design_test(np.concatenate([rel_tr, src_tr, tgt_tr, ones_tr], 1), y_tr,
                                               np.concatenate([rel_te, src_te, tgt_te, ones_te], 1), y_te)
                rows.append({"head": hi, "R2_rel": R2_rel, "R2_full": R2_full, "leakage_abs": R2_full - R2_rel})
            out[li] = rows
    return out


def robust_leakage_significance(forward, encode, texts, n_layers, *, n_samples, max_len=256, null_per_sample=1,
                                alpha_fdr=0.05, B_boot=2000, R_perm=5000, rng_seed=123, test_frac=0.3):
    """Their main function; ``encode(text, max_len)`` returns ids ``[1, T]`` (their ``_encode_text``)."""
    rng = np.random.default_rng(rng_seed)
    per_head_real, per_head_null = {}, {}
    for _ in range(n_samples):
        text = texts[rng.integers(0, len(texts))]
        TRACE.clear()
        with torch.no_grad():
            forward(encode(text, max_len))
        for li, rows in _compute_leakage_for_current_capture_cv(n_layers, test_frac, rng).items():
            for row in rows:
                per_head_real.setdefault((li, row["head"]), []).append(float(row["leakage_abs"]))
        for _ in range(null_per_sample):
            ids = encode(text, max_len)[0]
            if ids.shape[0] > 1:
                k = int(rng.integers(1, ids.shape[0]))
                ids_null = torch.cat([ids[k:], ids[:k]], dim=0).unsqueeze(0)
            else:
                ids_null = ids.unsqueeze(0)
            TRACE.clear()
            with torch.no_grad():
                forward(ids_null)
            for li, rows in _compute_leakage_for_current_capture_cv(n_layers, test_frac, rng).items():
                for row in rows:
                    per_head_null.setdefault((li, row["head"]), []).append(float(row["leakage_abs"]))
    rows_all, pvals = [], []
    for li in range(n_layers):
        for hi in range(len(get_layer_head_mats(li))):
            vr = np.asarray(per_head_real[(li, hi)], dtype=np.float64)
            vn = np.asarray(per_head_null[(li, hi)], dtype=np.float64)
            mean_gap = float(np.mean(vr) - np.mean(vn))
            n = min(vr.size, vn.size)
            diffs = vr[:n] - vn[:n]
            boots = np.empty(B_boot, dtype=np.float64)
            for b in range(B_boot):
                sel = rng.integers(0, n, size=n)
                boots[b] = float(np.mean(diffs[sel]))
            lo, hi_ci = float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975))
            flips = rng.choice([-1.0, 1.0], size=(R_perm, n))
            perm_gaps = (flips * diffs).mean(axis=1)
            p = float((np.sum(perm_gaps >= mean_gap) + 1) / (R_perm + 1))
            rows_all.append({"layer": li, "head": hi, "mean_gap": mean_gap, "ci_lo": lo, "ci_hi": hi_ci, "p": p,
                             "real": vr, "null": vn})
            pvals.append(p)
    p = np.asarray(pvals, dtype=np.float64)
    m = p.size
    order = np.argsort(p)
    ranks = np.empty(m, dtype=int)
    ranks[order] = np.arange(1, m + 1)
    q_sorted = np.minimum.accumulate((p[order] * m / ranks)[::-1])[::-1]
    q = np.empty_like(p)
    q[order] = q_sorted
    for i, r in enumerate(rows_all):
        r["q"] = float(q[i])
        r["significant"] = bool(q[i] <= alpha_fdr)
    return rows_all
