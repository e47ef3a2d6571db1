"""The reproduction's executors on the bridge backend (marked tl4: on TransformerLens 4.x, where
only the bridge exists, as well as on 3.9): Ray gives the serial run's tables, claims and
provenance, and a sweep writes its tables, on a tiny Llama and a tiny Gemma-3 booted into
TransformerBridge. test_pipeline_backend_parity.py compares them with the hooked backend's (3.x)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import ray  # a dev dependency: these tests run in CI, never skipped
from run_provenance import strip_timing

from lens_position.pipeline import Compute, RunConfig, run
from lens_position.pipeline.ray_executor import start_local_ray

pytestmark = pytest.mark.tl4

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

MODELS = ("tiny-llama", "tiny-gemma3")
STEPS = ("decompose", "sink_rate", "bos")


def _config(out: Path, executor: str, backend: str = "bridge") -> RunConfig:
    return RunConfig(out=out, models=MODELS, quick=True, T=24, N=4, executor=executor,
                     compute=Compute(threads=1, backend=backend), steps=STEPS, browser_check=False, progress=False)



@pytest.fixture(scope="module")
def serial_bridge(tmp_path_factory):
    return run(_config(tmp_path_factory.mktemp("serial") / "out", "serial"))


def test_the_bridge_run_says_so_and_ray_gives_the_serial_results(serial_bridge, tmp_path):
    start_local_ray(num_cpus=2, object_store_memory=80 * 2**20)
    try:
        on_ray = run(_config(tmp_path / "out", "ray"))
    finally:
        ray.shutdown()
    assert set(on_ray.tables) == set(serial_bridge.tables)
    for name, frame in serial_bridge.tables.items():
        pd.testing.assert_frame_equal(on_ray.tables[name], frame, check_exact=True, obj=name)
    pd.testing.assert_frame_equal(on_ray.claims, serial_bridge.claims, check_exact=True)
    ray_prov = json.loads((tmp_path / "out" / "provenance.json").read_text())
    serial_prov = json.loads(serial_bridge.files["provenance"].read_text())
    assert strip_timing(ray_prov) == strip_timing(serial_prov)
    assert '"backend": "bridge"' in json.dumps(serial_prov)


def test_a_sweep_on_the_bridge_writes_a_table_per_step_with_its_factors(tmp_path):
    from lens_position.cli.commands import main

    spec = tmp_path / "sweep.toml"
    spec.write_text('models = ["tiny-llama"]\nbos = ["force", "tokenizer"]\nsteps = ["decompose"]\n'
                    "quick = true\nT = 20\nN = 4\n")
    out = tmp_path / "sweep"
    assert main(["sweep", str(spec), "--out", str(out), "--backend", "bridge", "--threads", "1",
                 "--no-progress"]) == 0
    frame = pd.read_parquet(out / "decompose_layers.parquet")
    assert set(frame["bos"]) == {"force", "tokenizer"} and np.isfinite(frame["R_rf_heldout"]).all()


def test_the_zoo_on_the_bridge_leaves_out_what_it_cannot_run_and_says_so(caplog):
    from lens_position.models.zoo.store import checkpoints
    from lens_position.pipeline.models import expand_zoo

    every = [c.name for c in checkpoints()]
    learned = [c.name for c in checkpoints() if c.recipe.position == "learned"]
    assert learned and len(learned) < len(every)
    with caplog.at_level("WARNING"):
        kept = expand_zoo(["smollm2-135m", "zoo"], backend="bridge")
    assert kept == ("smollm2-135m", *[name for name in every if name not in learned])
    assert all(name in caplog.text for name in learned) and "backend='auto'" in caplog.text
    assert expand_zoo(["zoo:learned"], backend="bridge") == ("zoo:learned",)  # asked for by name: refused on load
    assert expand_zoo(["zoo"]) == tuple(every)  # "auto" runs every variant on either line
