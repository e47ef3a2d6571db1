#!/usr/bin/env bash
# The first environment's part of `make test`: the whole suite in .venv (TransformerLens 3.9), run in a
# network namespace of its own whose only way out is counted (tests/helpers/no_egress.sh): the suite
# fails when it fails, and when any test sent a packet to a non-loopback address. Two pytest-xdist
# workers (one per core on CI's two), each test file on one worker (module fixtures load once).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! { command -v unshare >/dev/null && unshare -n true 2>/dev/null && command -v ip >/dev/null; }; then
  echo "test-tl3: no network namespace here (it needs root, unshare and ip): the suite runs without its packet count" >&2
  exec .venv/bin/python -m pytest -n 2 --dist loadfile "$@"
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
rc=0
unshare -n sh tests/helpers/no_egress.sh .venv/bin/python -m pytest -n 2 --dist loadfile "$@" | tee "$log" || rc=$?
packets=$(grep -o '^tx_packets=[0-9]*' "$log" | tail -1 | cut -d= -f2)
[ -n "$packets" ] || { echo "test-tl3: the network namespace did not report a packet count" >&2; exit 1; }
[ "$rc" = 0 ] || exit "$rc"
if [ "$packets" != 0 ]; then
  echo "test-tl3: the test suite sent $packets packets to non-loopback addresses" >&2
  exit 1
fi
echo "test-tl3: the suite passed and sent no packet off the loopback"
