"""The package imports, and its command line answers, on whichever TransformerLens is installed.

Marked ``tl4``: `make test` runs these in `.venv-tl4` (TransformerLens 4.3, which removed
``HookedTransformer``) as well as in `.venv` (3.9). Each check runs in a fresh interpreter, so
what ``import lens_position`` and the command line pull in is measured from nothing, not from
what earlier tests already imported.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.tl4

# The console script's own entry point (pyproject.toml [project.scripts]), run by module path so the
# tree under test is the one imported, wherever the environment's script points.
RUN_CLI = "import sys; from lens_position.cli.commands import main; sys.argv[0] = 'lens-position'; sys.exit(main())"


def _python(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)


def _sub_commands() -> list[str]:
    from lens_position.cli.commands import build_parser

    actions = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(actions) == 1, "the command line has one level of sub-commands"
    return sorted(actions[0].choices)


def test_import_lens_position_reads_no_transformerlens_name():
    """``import lens_position`` and its public names' table load without touching TransformerLens."""
    probe = ("import json, sys, importlib.metadata as m, lens_position as lp; "
             "print(json.dumps({'version': lp.__version__, 'names': sorted(lp.__all__), "
             "'tl_loaded': 'transformer_lens' in sys.modules, 'tl': m.version('transformer_lens')}))")
    run = _python("-c", probe)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["version"], "no version"
    assert {"load_model", "MissingPackageError"} <= set(out["names"])
    assert not out["tl_loaded"], f"import lens_position imported transformer_lens {out['tl']}"


def test_every_sub_command_answers_help():
    names = _sub_commands()
    assert {"reproduce", "decompose", "sweep"} <= set(names)
    for argv in [["--help"]] + [[name, "--help"] for name in names]:
        run = _python("-c", RUN_CLI, *argv)
        assert run.returncode == 0, f"lens-position {' '.join(argv)}: {run.stderr}"
        assert run.stdout.startswith("usage: lens-position"), run.stdout[:200]
        assert "Traceback" not in run.stderr, run.stderr


def test_an_unknown_sub_command_is_a_usage_error_not_a_crash():
    """A command the parser does not know ends with argparse's usage error (exit 2), no traceback."""
    run = _python("-c", RUN_CLI, "no-such-command")
    assert run.returncode == 2, (run.returncode, run.stderr)
    assert "Traceback" not in run.stderr and "internal error" not in run.stderr, run.stderr
