"""benchmarks/long_context.py runs its analyses on a tiny model (each in its own process), prints one
line per analysis with its ratio to the bare passes, and writes one JSON record per analysis (tl4:
on both TransformerLens lines, through the hooked model or the bridge)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ANALYSES = ("decompose", "rotary_bands", "trajectory_patching", "bos_replacement")


@pytest.mark.tl4
def test_the_long_context_benchmark_prints_a_ratio_per_analysis(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = tmp_path / "long.jsonl"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "long_context.py"), "--model", "tiny-llama",
                           "--T", "48", "--N", "2", "--only", ",".join(ANALYSES), "--json", str(out)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "T = 48, N = 2" in lines[0] and "load average" in lines[0]
    for name in ANALYSES:
        assert any(line.startswith(name) and "x their bare CPU" in line and "the bare pass's" in line
                   for line in lines), proc.stdout
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["analysis"] for r in records] == list(ANALYSES)
    assert all(r["passes"] >= 1 and r["positions"] >= 48 and r["cpu_over_bare_passes"] > 0 for r in records)
