"""benchmarks/load_memory.py writes a Llama-shaped checkpoint, loads it twice in processes of their own
and prints each load's peak memory over the weights (tl4: on both TransformerLens lines, the hooked
backend reading its weight cache on the second load, the bridge reading the folder again)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.tl4
def test_the_load_memory_benchmark_prints_both_loads_against_the_weights(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = tmp_path / "load.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "load_memory.py"), "--layers", "2",
                           "--d-model", "256", "--vocab", "512", "--folder", str(tmp_path / "ckpt"),
                           "--json", str(out)], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "checkpoint weights:" in proc.stdout and "holds" in proc.stdout
    record = json.loads(out.read_text())
    cold, warm = record["cold"], record["warm"]
    assert not cold["from_cache"]
    assert warm["from_cache"] == (cold["backend"] == "hooked")  # the bridge reads the folder each time
    # 2 layers of d_model 256 (4 query heads, 1 key/value head of 64), MLP 1024, norms; 512 tokens, tied
    assert record["weights_mib"] == pytest.approx((2 * (2 * 256 * 256 + 2 * 256 * 64 + 3 * 256 * 1024 + 2 * 256)
                                                  + 256 + 512 * 256) * 4 / 2**20)
    assert cold["model_weights_mib"] >= record["weights_mib"]
    for run in (cold, warm):
        assert run["resident_mib"] > 0 and run["seconds"] > 0
        assert any(line.startswith(("cold", "warm")) and "x" in line for line in proc.stdout.splitlines())
