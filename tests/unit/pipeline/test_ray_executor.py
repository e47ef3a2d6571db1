"""The Ray executor gives the serial executor's results, survives a dead worker, reports a
failing cell with the cell while the rest finish, and resumes from the driver's cache.

One local Ray instance (2 CPUs, a small object store) serves the whole module.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pandas as pd
import pytest
import ray  # noqa: E402  (a dev dependency: these tests run in CI, never skipped)
from run_provenance import strip_timing

from lens_position.pipeline import Compute, RunConfig, run  # noqa: E402
from lens_position.pipeline.ray_executor import start_local_ray  # noqa: E402
from lens_position.pipeline.runner import CellsFailedError  # noqa: E402
from lens_position.pipeline.steps import STEPS, step_names  # noqa: E402

# Test-defined steps travel to the workers by value (the tests folder is not importable there).
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

MODELS = ("tiny-llama", "tiny-gemma3")
# One torch thread per model on both executors: results are then bitwise identical.
ONE_THREAD = Compute(threads=1)


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    start_local_ray(num_cpus=2, object_store_memory=80 * 2**20)
    yield
    ray.shutdown()


def _config(out: Path, executor: str, **kw) -> RunConfig:
    return RunConfig(out=out, models=MODELS, quick=True, T=24, N=3, executor=executor, compute=ONE_THREAD,
                     browser_check=False, progress=False, **kw)



@pytest.fixture(scope="module")
def serial_run(tmp_path_factory):
    return run(_config(tmp_path_factory.mktemp("serial") / "out", "serial"))


def test_ray_gives_the_serial_tables_claims_and_provenance(serial_run, tmp_path):
    on_ray = run(_config(tmp_path / "out", "ray"))
    assert set(on_ray.tables) == set(serial_run.tables)
    for name, frame in serial_run.tables.items():
        pd.testing.assert_frame_equal(on_ray.tables[name], frame, check_exact=True, obj=name)
    pd.testing.assert_frame_equal(on_ray.claims, serial_run.claims, check_exact=True)
    ray_prov = json.loads((tmp_path / "out" / "provenance.json").read_text())
    serial_prov = json.loads((serial_run.files["provenance"]).read_text())
    assert ray_prov["execution"]["executor"] == "ray" and serial_prov["execution"]["executor"] == "serial"
    assert strip_timing(ray_prov) == strip_timing(serial_prov)


def _dies_once(marker: str):
    """A decompose step whose worker process dies the first time it runs (as if killed)."""
    original = STEPS["decompose"]

    def run_step(ctx, sizes):
        if not os.path.exists(marker):
            Path(marker).write_text(str(os.getpid()))
            os._exit(1)  # the worker process is gone mid-run, no exception, no cleanup
        return original.run(ctx, sizes)

    return {**STEPS, "decompose": dataclasses.replace(original, run=run_step)}


@pytest.mark.fault(area='executor', given='a Ray worker process killed while it runs a step',
                   happens="the actor is restarted (model reloaded) and the step rerun; the run finishes with every "
                           "table, equal to the serial run's")
def test_a_killed_ray_worker_is_restarted_and_nothing_is_lost(serial_run, tmp_path):
    marker = tmp_path / "killed-once"
    result = run(_config(tmp_path / "out", "ray"), steps=_dies_once(str(marker)))
    assert marker.exists()  # a worker did die
    for name, frame in serial_run.tables.items():
        pd.testing.assert_frame_equal(result.tables[name], frame, check_exact=True, obj=name)
    assert not any(r.cached for r in result.steps)


def _fails_on(model: str):
    original = STEPS["probe"]

    def run_step(ctx, sizes):
        if ctx.spec.name == model:
            raise ValueError("a broken probe")
        return original.run(ctx, sizes)

    return {**STEPS, "probe": dataclasses.replace(original, run=run_step)}


@pytest.mark.fault(area='executor', given='one step of one model raising an error on Ray',
                   happens='the other steps finish and are cached; CellsFailedError names each failed step with its '
                           'model and condition; nothing is written to --out; the same command again computes only '
                           'the failed steps')
def test_a_failing_cell_is_reported_with_its_cell_the_rest_finish_and_a_rerun_resumes(serial_run, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(CellsFailedError) as failed:
        run(_config(out, "ray"), steps=_fails_on("tiny-gemma3"))
    [(cell, error)] = failed.value.failures
    assert (cell.model, cell.step) == ("tiny-gemma3", "probe") and isinstance(error, ValueError)
    assert "probe on tiny-gemma3" in str(failed.value)
    # nothing written for a run with a hole in it: the folder is only claimed, its manifest incomplete
    manifest = json.loads((out / "provenance.json").read_text())
    assert manifest["complete"] is False and manifest["files"] == []
    assert sorted(p.name for p in out.iterdir()) == ["cache", "provenance.json"]
    rerun = run(_config(out, "ray"))
    computed = [(r.model, r.step) for r in rerun.steps if r.step != "load" and not r.cached]
    assert computed == [("tiny-gemma3", "probe")]  # every other cell came back from the cache
    for name, frame in serial_run.tables.items():
        pd.testing.assert_frame_equal(rerun.tables[name], frame, check_exact=True, obj=name)


SWEEP_SPEC = """
models = ["tiny-llama", "tiny-gemma3"]
bos = ["force", "tokenizer"]
seeds = [0, 1]
steps = ["decompose", "probe", "sink_rate", "fingerprint"]
quick = true
T = 20
N = 4  # the smallest N with intervals (MIN_INTERVAL_UNITS): the sweep writes every table
"""


def test_a_sweep_on_ray_writes_one_table_per_step_with_a_column_per_factor(tmp_path, capsys):
    from lens_position.cli.commands import main
    from lens_position.pipeline.steps import tables_of

    spec = tmp_path / "sweep.toml"
    spec.write_text(SWEEP_SPEC)
    out = tmp_path / "sweep"
    assert main(["sweep", str(spec), "--out", str(out), "--executor", "ray", "--threads", "1",
                 "--no-progress"]) == 0
    expected = tables_of(("decompose", "probe", "sink_rate", "fingerprint"))
    conditions = {(b, s) for b in ("force", "tokenizer") for s in (0, 1)}
    for name in expected:
        frame = pd.read_parquet(out / f"{name}.parquet")
        assert {"model", "source", "bos", "seed"} <= set(frame.columns), name
        cells = set(zip(frame["model"], frame["bos"], frame["seed"]))
        assert cells == {(m, b, s) for m in MODELS for b, s in conditions}, name
    # a factor changes what is measured: the seed picks other text windows
    layers = pd.read_parquet(out / "decompose_layers.parquet")
    by_seed = [part["total_heldout"].to_numpy() for _, part in
               layers[(layers["model"] == "tiny-llama") & (layers["bos"] == "force")].groupby("seed")]
    assert not (by_seed[0] == by_seed[1]).all()
    claims = pd.read_csv(out / "claims.csv")
    assert set(zip(claims["bos"], claims["seed"])) == conditions
    manifest = json.loads((out / "provenance.json").read_text())
    assert manifest["complete"] is True and len(manifest["conditions"]) == 4
    index = (out / "report.html").read_text()
    for bos, seed in conditions:
        report = out / f"report-natural-{bos}-seed{seed}.html"
        assert report.is_file() and report.name in index
    assert "4 conditions" in capsys.readouterr().out


def test_a_ray_run_counts_finished_cells_in_one_labelled_bar(serial_run, tmp_path, capsys, monkeypatch):
    """Cells run at once in other processes, so the driver shows one bar counting finished
    cells (no per-cell bars from the workers); in a non-TTY log it is plain lines."""
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    capsys.readouterr()
    run(dataclasses.replace(_config(tmp_path / "out", "ray"), progress=True))
    err = capsys.readouterr().err
    cells = len(MODELS) * len(step_names())  # a default run: opt-in steps are not cells
    ours = [line for line in err.splitlines() if line.startswith("reproduce:")]
    assert len(ours) >= 1 and ours[-1].startswith(f"reproduce: {cells}/{cells} cells in "), err
    assert not any("\r" in line or "\x1b[A" in line for line in ours)


def test_starting_a_local_instance_routes_http_to_a_closed_loopback_port_and_restores_the_proxies(monkeypatch):
    """While the head processes start, plain HTTP goes nowhere (no cloud-metadata question leaves the
    machine); afterwards this process, and the workers, have the caller's own proxy settings."""
    from lens_position.pipeline import ray_executor

    monkeypatch.setenv("http_proxy", "http://proxy.example:3128")
    monkeypatch.delenv("HTTP_PROXY", raising=False)
    monkeypatch.setenv("no_proxy", "localhost")
    monkeypatch.delenv("NO_PROXY", raising=False)
    with ray_executor._head_processes_offline() as own:
        assert os.environ["http_proxy"] == os.environ["HTTP_PROXY"] == ray_executor.CLOSED_LOOPBACK_PROXY
        assert os.environ["no_proxy"] == os.environ["NO_PROXY"] == ""
        import urllib.request

        assert urllib.request.getproxies()["http"].startswith("http://127.0.0.1:")
        assert not urllib.request.proxy_bypass("169.254.169.254")
    assert own == {"http_proxy": "http://proxy.example:3128", "HTTP_PROXY": "", "no_proxy": "localhost",
                   "NO_PROXY": ""}
    assert os.environ["http_proxy"] == "http://proxy.example:3128" and os.environ["no_proxy"] == "localhost"
    assert "HTTP_PROXY" not in os.environ and "NO_PROXY" not in os.environ
