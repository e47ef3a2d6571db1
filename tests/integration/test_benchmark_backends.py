"""benchmarks/backends.py runs on a tiny model and prints its ratio lines (never its times:
they depend on the machine). Marked tl4: under TransformerLens 4.x it prints the bridge's
numbers alone."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lens_position.models.backends import bridge_class, hooked_available

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.tl4
def test_backends_benchmark_prints_its_ratios(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = tmp_path / "backends.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "backends.py"), "--models", "tiny-llama",
                           "--N", "2", "--T", "12", "--batch-size", "2", "--repeats", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    backends = [name for name, ok in (("hooked", hooked_available()), ("bridge", bridge_class() is not None)) if ok]
    assert backends
    for backend in backends:
        assert any(line.strip().startswith(f"ratio {backend} decomposition / {backend} bare forward:") and
                   "target <= 1.2x" in line and "median of 2 alternating pairs" in line for line in lines), proc.stdout
        assert any(line.strip().startswith(f"{backend} ") and " load " in line for line in lines), proc.stdout
    has_pair = set(backends) == {"hooked", "bridge"}
    assert any(line.strip().startswith("ratio bridge / hooked:") for line in lines) == has_pair, proc.stdout
    assert ("no HookedTransformer in this TransformerLens" in proc.stdout) == (not hooked_available())
    assert "load average" in lines[0] and "load average after" in proc.stdout
    assert out.exists() and '"decompose_over_bare"' in out.read_text()
    for backend in backends:
        measured = next(row for row in json.loads(out.read_text())["results"])["backends"][backend]
        pairs = measured["pair_ratios_cpu"]
        assert len(pairs) == 2 and pairs == sorted(pairs) and all(ratio > 0 for ratio in pairs)
        assert pairs[0] <= measured["decompose_over_bare_cpu_median"] <= pairs[-1]
