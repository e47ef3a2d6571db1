"""Tolerances of backend parity (hooked vs bridge, the same prompts), from float32 forward noise.

The two backends compute the same float32 operations in another order (HF's modules vs
TransformerLens's): activations of O(1-10) differ by a few ulps per block (measured on the
tiny models: logits 8e-6, scores 5e-6, patterns 9e-7). The statistics are float64 reductions of
those activations, so their differences are of the same relative size (measured: decomposition
fractions 2e-7, sink scores 1e-7). Each tolerance is about 10x the largest difference measured,
and far below any difference a verdict could turn on (intervals are ~1e-2 wide).
docs/howto/which-transformerlens.md lists the same table (tests/unit/models/test_backend_parity.py
checks it).
"""

TOLERANCES: dict[str, float] = {
    "logits": 1e-4,
    "attention scores (visible keys)": 5e-5,
    "attention pattern": 1e-5,
    "decomposition columns (T, R, M, C, both splits, held-out, intervals)": 2e-6,
    "sink scores": 1e-6,
    "BOS replacement (fraction removed, per layer and overall)": 1e-5,
    "resid_pre patching sweep (metric)": 1e-4,
}
