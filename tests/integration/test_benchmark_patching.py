"""benchmarks/patching.py with TransformerLens timed on a sample of cells: it says the
TransformerLens time is extrapolated, and checks equality on the sampled cells."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_patching_benchmark_sampled_transformer_lens(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = tmp_path / "patching.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "patching.py"), "--model", "tiny-llama",
                           "--T", "6", "--repeats", "1", "--tl-sample", "4", "--threads", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "transformer_lens EXTRAPOLATED from 4 measured cells" in proc.stdout
    assert "on the 4 sampled cells" in proc.stdout and ": OK" in proc.stdout
    result = json.loads(out.read_text())["results"][0]
    cells = result["transformer_lens_sampled_cells"]
    assert len(cells) == 4 and len({tuple(c) for c in cells}) == 4
    layers, positions = {c[0] for c in cells}, {c[1] for c in cells}
    assert {0, result["layers"] - 1} <= layers and {0, 5} <= positions  # both ends of both axes
    assert result["max_abs_diff"] <= 1e-4 and result["max_abs_diff_no_reuse"] <= 1e-4
    assert result["transformer_lens_s"] > result["transformer_lens_s_per_cell"] * result["cells"]
