"""One result of every analysis on the tiny random Llama (seconds on a CPU), for the tests
that check every result the same way: its summary, its columns, its table order."""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=1)
def all_results() -> dict:
    from lens_position.analyses.analyze import analyze
    from lens_position.analyses.bos import bos_replacement
    from lens_position.analyses.compare import compare
    from lens_position.analyses.decompose import decompose
    from lens_position.analyses.fingerprint import fingerprint
    from lens_position.analyses.leakage import leakage_texts, positional_leakage
    from lens_position.analyses.length_sweep import length_sweep
    from lens_position.analyses.massive import massive_activations, massive_intervention
    from lens_position.analyses.patching import resid_pre_sweep
    from lens_position.analyses.probes import position_probe
    from lens_position.analyses.prompt_sets import across_prompt_sets
    from lens_position.analyses.rollout import attention_rollout
    from lens_position.analyses.sink_definitions import sink_metric
    from lens_position.analyses.sink_origin import sink_origin
    from lens_position.analyses.sinks import sink_heads, sink_rate, sink_reading_heads
    from lens_position.analyses.trajectory import trajectory_patching
    from lens_position.core.data import build_prompts
    from lens_position.models import load_model

    torch.manual_seed(0)
    model = load_model("tiny-llama")
    prompts = build_prompts(model, source="random", T=24, N=4, bos="force")
    base = decompose(model, prompts, progress=False)
    return {
        "model": model, "prompts": prompts,
        "Decomposition": base,
        "BosReplacement": bos_replacement(model, prompts, query_range=(0, 16), progress=False),
        "SinkHeads": sink_heads(model, prompts, progress=False),
        "SinkRate": sink_rate(model, T=16, N=4, progress=False),
        "SinkReading": sink_reading_heads(model, prompts, query_range=(0, 16), progress=False),
        "ProbeResult": position_probe(model, prompts, progress=False),
        "Fingerprint": fingerprint(model, T=16, N=4, progress=False),
        "TrajectoryPatching": trajectory_patching(model, prompts, query_range=(0, 16), progress=False),
        "PatchSweep": resid_pre_sweep(model, prompts.tokens, prompts.tokens,
                                      lambda logits: logits[:, -1].logsumexp(-1).mean(), progress=False),
        "Comparison": compare(base, {"itself": base}),
        "LengthSweep": length_sweep(model, (8, 16), N=4, source="random", progress=False),
        "AttentionRollout": attention_rollout(model, prompts, progress=False),
        "SinkMetric": sink_metric(model, definition="eviction", T=40, N=4, window=12, sinks=2, progress=False),
        "PositionalLeakage": positional_leakage(model, leakage_texts()[:6], n_samples=4, n_seeds=2, n_perm=100,
                                                progress=False),
        "SinkOrigin": sink_origin(model, T=16, N=4, progress=False),
        "MassiveActivations": massive_activations(model, prompts, min_magnitude=0, min_ratio=4, progress=False),
        "MassiveIntervention": massive_intervention(model, prompts, layer=1, entries=[(0, 3)], progress=False),
        "PromptSetSpread": across_prompt_sets(model, 2, T=16, N=4, source="random", progress=False),
        "Analysis": analyze(model, prompts, progress=False),
    }


def results() -> dict:
    """Only the result objects, by class name."""
    return {k: v for k, v in all_results().items() if k not in ("model", "prompts")}


@functools.lru_cache(maxsize=1)
def instrument_results() -> dict:
    """One result of each instrument (position-0 convergence, rotary bands, window-aware sinks) on the
    same model and prompts, for the tests that check what every result prints."""
    from lens_position.analyses.convergence import position0_convergence
    from lens_position.analyses.rotary_bands import rotary_bands
    from lens_position.analyses.sinks import window_sinks

    model, prompts = all_results()["model"], all_results()["prompts"]
    return {
        "RotaryBands": rotary_bands(model, prompts, progress=False),
        "Position0Convergence": position0_convergence(model, prompts, progress=False),
        "WindowSinks": window_sinks(model, prompts, progress=False),
    }
