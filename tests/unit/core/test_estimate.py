"""The run-time estimate printed before long work: monotone in the sizes, and the right order of
magnitude against the measured time of tiny runs (a generous band: a guide, not a measurement)."""

from __future__ import annotations

import io
import json
import time

import pytest

import lens_position as lp
from lens_position.core import estimate as E
from lens_position.core.intervals import Bootstrap
from lens_position.core.stream import BATCH_SIZE
from lens_position.pipeline import estimate as pipeline_estimate
from lens_position.pipeline.steps import STEPS

# measured / estimated must lie in this band: a check of units and orders of magnitude (seconds, not
# minutes or milliseconds), not a timing. Wide, because a shared CI machine's load moves a tiny run's
# time by 10x between the calibration and the run, and a sub-second estimate is printed in whole seconds.
BAND = (0.02, 50.0)
# a fixed machine, so that the shape of the model is tested without timing noise
MACHINE = E.Machine(flops=1e10, float64_flops=5e9, float64_ops=1e8, block_overhead_s=0.005, threads=2, device="cpu")
COST = E.ModelCost(n_layers=30, n_heads=9, n_kv_heads=3, d_model=576, d_head=64, d_mlp=1536)


def _decompose_s(T, N, R=200, layers=None, batch_size=16):
    return E.seconds(E.decomposition_work(COST, sequences=N, positions=T, batch_size=batch_size, replicates=R,
                                          layers=layers), COST, MACHINE)


@pytest.mark.parametrize("sizes", [(16, 4), (64, 4), (128, 16), (512, 8)])
def test_the_estimate_grows_with_T_N_layers_and_replicates(sizes):
    T, N = sizes
    base = _decompose_s(T, N)
    assert _decompose_s(2 * T, N) > base
    assert _decompose_s(T, 2 * N) > base
    assert _decompose_s(T, N, R=400) > base
    assert _decompose_s(T, N, layers=10) < base


def test_the_estimate_grows_with_the_model_and_shrinks_on_a_faster_machine():
    bigger = E.ModelCost(n_layers=32, n_heads=32, n_kv_heads=8, d_model=4096, d_head=128, d_mlp=14336)
    work = dict(sequences=16, positions=128, batch_size=16, replicates=200)
    small = E.seconds(E.decomposition_work(COST, **work), COST, MACHINE)
    large = E.seconds(E.decomposition_work(bigger, **work), bigger, MACHINE)
    assert large > 10 * small
    faster = E.Machine(flops=1e12, float64_flops=5e11, float64_ops=1e10, block_overhead_s=5e-5, threads=8, device="cpu")
    assert E.seconds(E.decomposition_work(COST, **work), COST, faster) < small / 10


def test_every_step_of_the_pipeline_has_its_work_and_each_is_monotone_in_N():
    import dataclasses

    from lens_position.pipeline.steps import Sizes

    for name in STEPS:
        sizes = Sizes(T=64, N=8, batch_size=16, n_resamples=50, query_range=(0, 32), K=2, n_bands=4)
        one = E.seconds(pipeline_estimate.step_work(name, sizes, COST), COST, MACHINE)
        two = E.seconds(pipeline_estimate.step_work(name, dataclasses.replace(sizes, N=16), COST), COST, MACHINE)
        assert 0 < one < two, name


def test_the_sentence_is_a_range_around_the_estimate():
    text = E.describe(150.0, MACHINE)
    assert text.startswith("estimated ") and "on this machine (2 CPU threads" in text
    assert "1-5 min" in text  # 75 s to 300 s
    assert "4-18 s" in E.describe(9.0, MACHINE)
    assert "0.8-3.0 h" in E.describe(5400.0, MACHINE)


@pytest.fixture(scope="module")
def tiny():
    return lp.load_model("tiny-llama")


def test_a_tiny_decomposition_takes_the_estimated_order_of_magnitude(tiny):
    machine = E.calibrate("cpu", model=tiny)
    cost = E.ModelCost.of(tiny)
    prompts = lp.build_prompts(tiny, source="random", T=96, N=8, bos="force")
    lp.decompose(tiny, prompts, bootstrap=Bootstrap(n_resamples=20), progress=False)  # warm: first-call costs
    started = time.perf_counter()
    lp.decompose(tiny, prompts, bootstrap=Bootstrap(n_resamples=100), progress=False)
    measured = time.perf_counter() - started
    estimated = E.seconds(E.decomposition_work(cost, sequences=8, positions=96, batch_size=BATCH_SIZE,
                                               replicates=100), cost, machine)
    assert BAND[0] <= measured / estimated <= BAND[1], (measured, estimated, machine)


def test_analyze_prints_its_estimate_before_it_starts_and_takes_about_that(tiny, monkeypatch):
    prompts = lp.build_prompts(tiny, source="random", T=48, N=4, bos="force")
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    started = time.perf_counter()
    lp.analyze(tiny, prompts, bootstrap=Bootstrap(n_resamples=50))
    measured = time.perf_counter() - started
    lines = err.getvalue().splitlines()
    first = lines[0]
    assert first.startswith("analyze on tiny-llama: estimated "), lines[:3]
    low, high = _range_seconds(first)
    assert BAND[0] <= measured / ((low * high) ** 0.5) <= BAND[1], (measured, first)


def _range_seconds(text: str) -> tuple[float, float]:
    """The two ends of "estimated 2-4 min" / "estimated 40 s to 2 min" in seconds."""
    import re

    unit = {"s": 1, "min": 60, "h": 3600}
    match = re.search(r"estimated ([\d.]+)-([\d.]+) (s|min|h) on this machine", text)
    assert match, text
    scale = unit[match.group(3)]
    return float(match.group(1)) * scale, float(match.group(2)) * scale


def test_a_sub_command_prints_its_estimate_first_and_its_steps_take_about_that(tmp_path, capsys):
    from lens_position.cli.commands import main

    out = tmp_path / "run"
    assert main(["decompose", "tiny-llama", "--quick", "--N", "6", "--out", str(out), "--no-cache"]) == 0
    err = capsys.readouterr().err
    line = next(l for l in err.splitlines() if "estimated" in l)
    assert line.startswith("tiny-llama: 2 steps to compute, estimated "), err
    assert err.index(line) < err.index("decompose")  # before the step's progress
    low, high = _range_seconds(line)
    steps = json.loads((out / "provenance.json").read_text())["steps"]
    measured = sum(s["wall_s"] for s in steps if s["step"] != "load")
    assert BAND[0] <= measured / ((low * high) ** 0.5) <= BAND[1], (measured, line)


def test_no_estimate_is_printed_without_progress(tmp_path, capsys):
    from lens_position.cli.commands import main

    assert main(["decompose", "tiny-llama", "--quick", "--out", str(tmp_path / "q"), "--no-progress"]) == 0
    assert "estimated" not in capsys.readouterr().err
