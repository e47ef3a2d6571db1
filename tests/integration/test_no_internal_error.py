"""The command line through the failure modes of the bad-input classes: each ends in the package's
own error (exit 1) or a bad option (exit 2), never "internal error" (exit 3); and a whole run, its
browser check included, sends no packet to a non-loopback address (run in a network namespace
whose only way out is a link that counts what leaves: tests/helpers/no_egress.sh)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lens_position.cli import commands as cli
from lens_position.pipeline.outputs import OutputFolder

NO_EGRESS = Path(__file__).resolve().parents[1] / "helpers" / "no_egress.sh"
ROOT = Path(__file__).resolve().parents[2]


def status_of(capsys, *argv) -> tuple[int, str]:
    try:
        status = cli.main(list(argv))
    except SystemExit as stop:  # argparse's bad options
        status = stop.code
    return status, capsys.readouterr().err


def foreign_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "report.png").write_bytes(b"the user's")
    return folder


CASES = {
    "empty --out": lambda tmp: ["decompose", "tiny-llama", "--quick", "--out", ""],
    "a folder of the user's files": lambda tmp: ["decompose", "tiny-llama", "--quick", "--out",
                                                 str(foreign_folder(tmp))],
    "query 0 alone": lambda tmp: ["decompose", "tiny-llama", "--quick", "--query-range", "0:1", "--out",
                                  str(tmp / "q0")],
    "a Ray address where nothing listens": lambda tmp: ["decompose", "tiny-llama", "--quick", "--executor", "ray",
                                                        "--ray-address", "127.0.0.1:9", "--out", str(tmp / "ray")],
    "a truncated .gguf": lambda tmp: ["decompose", str(_truncated_gguf(tmp)), "--quick", "--out", str(tmp / "g")],
}


def _truncated_gguf(tmp: Path) -> Path:
    path = tmp / "model.gguf"
    path.write_bytes(b"GGUF\x03\x00")
    return path


@pytest.mark.fault(area="command line", given="each failure mode of the bad-input classes (empty --out, a folder "
                   "of the user's files, query 0 alone, a dead Ray address, a truncated file)",
                   happens="the package's error (exit 1) or a bad option (exit 2), never 'internal error' (exit 3)")
@pytest.mark.parametrize("case", sorted(CASES))
def test_no_failure_mode_ends_as_an_internal_error(capsys, tmp_path, case):
    status, err = status_of(capsys, *CASES[case](tmp_path))
    assert status in (cli.EXIT_ERROR, cli.EXIT_USAGE), (status, err)
    assert "internal error" not in err
    if case == "a folder of the user's files":
        assert (tmp_path / "mine" / "report.png").read_bytes() == b"the user's" and "--force" in err


def test_a_second_run_into_a_folder_in_use_is_refused_on_the_command_line(capsys, tmp_path):
    with OutputFolder(tmp_path / "busy", {"report.html"}):
        status, err = status_of(capsys, "decompose", "tiny-llama", "--quick", "--out", str(tmp_path / "busy"))
    assert status == cli.EXIT_ERROR and "another run" in err


def _no_egress(*command: str, cwd: Path) -> tuple[int, int, str]:
    """(exit status, packets sent off the loopback, output) of ``command`` in its own network namespace."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(["unshare", "-n", "sh", str(NO_EGRESS), *command], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=900)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("tx_packets=")]
    assert lines, f"the namespace did not start:\n{proc.stderr[-2000:]}"
    return proc.returncode, int(lines[-1].split("=")[1]), proc.stdout + proc.stderr


def test_the_egress_counter_sees_a_packet_to_a_public_address(tmp_path):
    """The check can fail: one UDP datagram to a public address is counted."""
    script = "import socket; socket.socket(socket.AF_INET6, socket.SOCK_DGRAM).sendto(b'x', ('2001:db8::1', 53))"
    status, packets, _ = _no_egress(sys.executable, "-c", script, cwd=tmp_path)
    assert status == 0 and packets >= 1


@pytest.mark.fault(area="network", given="the report's browser check (headless Chromium) and a whole command-line run",
                   happens="no packet leaves for a non-loopback address (it sent DNS queries and a UDP packet)")
def test_a_command_line_run_with_its_browser_check_sends_no_packet(tmp_path):
    out = tmp_path / "out"
    status, packets, output = _no_egress(sys.executable, "-m", "lens_position.cli.commands", "decompose",
                                         "tiny-llama", "--quick", "--browser-check", "--no-progress", "--out",
                                         str(out), cwd=tmp_path)
    assert status == 0, output[-3000:]
    assert (out / "report.html").is_file()
    assert packets == 0, output[-3000:]
