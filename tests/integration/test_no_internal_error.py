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
    "an empty --ray-address": lambda tmp: ["decompose", "tiny-llama", "--quick", "--executor", "ray", "--ray-address",
                                           "", "--out", str(tmp / "r0")],
    "--ray-address without --executor ray": lambda tmp: ["decompose", "tiny-llama", "--quick", "--ray-address",
                                                         "localhost:1", "--out", str(tmp / "r1")],
    "a sweep spec with seeds = [-1]": lambda tmp: ["sweep", str(_file(tmp / "s.toml", 'models = ["tiny-llama"]\n'
                                                                  'seeds = [-1]\nquick = true\n')),
                                                   "--out", str(tmp / "s")],
    "a sweep spec that is a folder": lambda tmp: ["sweep", str(tmp), "--out", str(tmp / "s")],
    "a sweep spec that is not UTF-8": lambda tmp: ["sweep", str(_file(tmp / "s.toml", b"\xff\xfe models")),
                                                   "--out", str(tmp / "s")],
    "--threads 100000": lambda tmp: ["decompose", "tiny-llama", "--quick", "--threads", "100000", "--out",
                                     str(tmp / "t")],
    "--out a symlink to a folder of the user's files": lambda tmp: ["decompose", "tiny-llama", "--quick", "--out",
                                                                    str(_link(tmp / "link", foreign_folder(tmp)))],
    "--out /dev/null": lambda tmp: ["decompose", "tiny-llama", "--quick", "--out", "/dev/null"],
    "--out an existing file": lambda tmp: ["decompose", "tiny-llama", "--quick", "--out",
                                           str(_file(tmp / "notes.txt", "mine"))],
    "--bos token: without a token": lambda tmp: ["decompose", "tiny-llama", "--quick", "--bos", "token:", "--out",
                                                 str(tmp / "b")],
    "--bos token:<id beyond the vocabulary>": lambda tmp: ["decompose", "tiny-llama", "--quick", "--bos",
                                                           "token:999999", "--out", str(tmp / "b2")],
    "a load option window=nan": lambda tmp: ["decompose", "tiny-llama@window=nan", "--quick", "--out", str(tmp / "w")],
    "an unknown load option": lambda tmp: ["decompose", "tiny-llama@bogus=1", "--quick", "--out", str(tmp / "w2")],
    "--T beyond the context": lambda tmp: ["decompose", "tiny-llama", "--quick", "--T", "100000", "--out",
                                           str(tmp / "T")],
    "--query-range beyond T": lambda tmp: ["decompose", "tiny-llama", "--quick", "--query-range", "100:200", "--out",
                                           str(tmp / "q")],
    "--text a binary file": lambda tmp: ["decompose", "tiny-llama", "--quick", "--text",
                                         str(_file(tmp / "bin.txt", bytes(range(256)))), "--out", str(tmp / "x")],
    "--layers beyond the model": lambda tmp: ["decompose", "tiny-llama", "--quick", "--layers", "7", "--out",
                                              str(tmp / "l")],
    "--N 1": lambda tmp: ["decompose", "tiny-llama", "--quick", "--N", "1", "--out", str(tmp / "n")],
}


def _file(path: Path, content: str | bytes) -> Path:
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def _link(path: Path, target: Path) -> Path:
    path.symlink_to(target)
    return path


def _truncated_gguf(tmp: Path) -> Path:
    path = tmp / "model.gguf"
    path.write_bytes(b"GGUF\x03\x00")
    return path


@pytest.mark.fault(area="command line", given="each failure mode of the bad-input classes (empty --out, a folder "
                   "of the user's files, query 0 alone, a dead Ray address, a truncated file)",
                   happens="the package's error (exit 1) or a bad option (exit 2), never 'internal error' (exit 3)")
@pytest.mark.fault(area="command line", given="an empty --ray-address, or --ray-address without --executor ray; a "
                   "sweep spec with seeds = [-1], that is a folder or not UTF-8; --threads 100000",
                   happens="the package's error (exit 1): each was 'internal error' (exit 3), or the address was "
                           "silently ignored")
@pytest.mark.fault(area="command line", given="--out a symlink to a folder of the user's files, /dev/null or a file; "
                   "--bos token:, a token beyond the vocabulary; load options window=nan or unknown; --T beyond "
                   "the context; --query-range beyond T; --text a binary file; --layers beyond the model; --N 1",
                   happens="the package's error (exit 1) or a bad option (exit 2), never 'internal error' (exit 3)")
@pytest.mark.parametrize("case", sorted(CASES))
def test_no_failure_mode_ends_as_an_internal_error(capsys, tmp_path, case):
    status, err = status_of(capsys, *CASES[case](tmp_path))
    assert status in (cli.EXIT_ERROR, cli.EXIT_USAGE), (status, err)
    assert "internal error" not in err
    if case in ("a folder of the user's files", "--out a symlink to a folder of the user's files"):
        assert (tmp_path / "mine" / "report.png").read_bytes() == b"the user's" and "--force" in err
        assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["report.png"]


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


@pytest.mark.fault(area="network", given="a command-line run on a local Ray instance (--executor ray)",
                   happens="no packet leaves for a non-loopback address (Ray's head process asked the cloud metadata "
                           "services, 169.254.169.254 and metadata.google.internal, at every start)")
def test_a_run_on_a_local_ray_instance_sends_no_packet(tmp_path):
    out = tmp_path / "out"
    status, packets, output = _no_egress(sys.executable, "-m", "lens_position.cli.commands", "decompose",
                                         "tiny-llama", "--quick", "--executor", "ray",
                                         "--no-progress", "--out", str(out), cwd=tmp_path)
    assert status == 0, output[-3000:]
    assert (out / "report.html").is_file()
    assert packets == 0, output[-3000:]


FIGURE_EXPORT = """
import sys
from pathlib import Path
import plotly.graph_objects as go
from lens_position.report.plots import save_figure
out = Path(sys.argv[1])
fig = go.Figure(go.Scatter(x=[0, 1, 2], y=[2, 0, 1]), layout={"title": {"text": "R' by layer"}})
for fmt, magic in (("png", b"\\x89PNG"), ("svg", b"<svg"), ("pdf", b"%PDF")):
    path = save_figure(fig, out / f"figure.{fmt}")
    assert magic in path.read_bytes()[:400], (fmt, path.read_bytes()[:40])
print("exported")
"""


@pytest.mark.fault(area="network", given="a static figure export (save_figure to PNG, SVG, PDF: kaleido's Chromium)",
                   happens="no packet leaves for a non-loopback address: kaleido's Chromium gets the report's "
                           "network-off flags and MathJax is off (kaleido's default fetched it from a CDN)")
def test_a_figure_export_sends_no_packet(tmp_path):
    status, packets, output = _no_egress(sys.executable, "-c", FIGURE_EXPORT, str(tmp_path), cwd=tmp_path)
    assert status == 0 and "exported" in output, output[-3000:]
    assert packets == 0, output[-3000:]


def test_kaleidos_chromium_is_started_with_the_network_off():
    """The flags reach the command line kaleido's Chromium is started with (not only our own browser's)."""
    from choreographer.channels import Pipe

    from lens_position.report.browser import NETWORK_OFF, kaleido_options

    options = kaleido_options()
    channel = Pipe()  # get_cli builds the command line only: no browser is started
    browser = options["browser_cls"](channel, "/bin/true")
    try:
        browser.pre_open()  # its temporary profile folder
        cli = browser.get_cli()
    finally:
        browser.clean()
        channel.close()
    assert set(NETWORK_OFF) <= set(cli)
    assert options["mathjax"] is False and Path(options["plotlyjs"]).is_file()


# The benchmarks' smallest invocations (each one's own docstring names it), cut to seconds.
BENCHMARKS = [
    ["benchmarks/decompose.py", "--model", "tiny-llama", "--N", "4", "--T", "24", "--skip-dense"],
    ["benchmarks/gpu.py", "--models", "tiny-llama", "--device", "cpu", "--T", "24", "--N", "4", "--batch-size", "4"],
    ["benchmarks/patching.py", "--model", "tiny-llama", "--T", "8", "--repeats", "1"],
    ["benchmarks/backends.py", "--models", "tiny-llama", "--N", "4", "--T", "16", "--repeats", "1"],
    ["benchmarks/probe_intervals.py", "--model", "tiny-llama", "--sets", "2", "--T", "16", "--N", "4", "--layers", "0"],
    ["benchmarks/reproduce.py", "--models", "tiny-llama", "--quick", "--T", "16", "--N", "4"],
    ["benchmarks/grouped_kv.py", "--model", "tiny-llama", "--T", "8", "--passes", "1", "--repeats", "1"],
]
# The ones that need a real model (the embedded SmolLM2, read offline), marked slow.
REAL_MODEL_BENCHMARKS = [
    ["benchmarks/load.py", "--models", "smollm2-135m"],
    ["benchmarks/decompose_real.py", "--models", "smollm2-135m", "--T", "32", "--N", "2"],
]


def _assert_benchmarks_send_no_packet(benchmarks: list[list[str]]) -> None:
    """Run the benchmarks one after the other in a counting network namespace: each exits 0, none sends a packet."""
    script = " && ".join(" ".join([sys.executable, str(ROOT / bench[0]), *bench[1:], ">", "/dev/null"])
                         for bench in benchmarks)
    status, packets, output = _no_egress("sh", "-c", script, cwd=ROOT)
    assert status == 0, output[-3000:]
    assert packets == 0, output[-3000:]


READ_ONLY = """
import sys
import plotly.graph_objects as go
import torch
from lens_position.analyses.decompose import decompose
from lens_position.core.intervals import NO_INTERVALS
from lens_position.ground.errors import LensPositionError
from lens_position.models.toy import random_model
from lens_position.report.plots import save_figure
folder = sys.argv[1]
result = decompose(random_model(n_layers=1, d_vocab=20), torch.randint(0, 20, (4, 8)), bootstrap=NO_INTERVALS,
                   progress=False)
for write in (lambda: result.save(folder + "/result"), lambda: save_figure(go.Figure(), folder + "/f.html")):
    try:
        write()
    except LensPositionError as error:
        assert "read-only file system" in str(error).lower(), error
    else:
        raise AssertionError("wrote into a read-only folder")
print("refused")
"""


@pytest.mark.fault(area="output folder", given="an output folder on a read-only file system (the command line, "
                   "result.save, save_figure)",
                   happens="the package's error naming the folder and 'Read-only file system' (exit 1; from Python "
                           "a raw OSError before)")
def test_a_read_only_output_folder_is_the_users_error(tmp_path):
    folder = tmp_path / "read-only"
    folder.mkdir()
    command = (f"mount -t tmpfs -o ro tmpfs {folder} && {sys.executable} -c '{READ_ONLY}' {folder} && "
               f"{sys.executable} -m lens_position.cli.commands decompose tiny-llama --quick --no-progress "
               f"--out {folder}/out; echo status=$?")
    proc = subprocess.run(["unshare", "-m", "sh", "-c", command], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert "refused" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert f"status={cli.EXIT_ERROR}" in proc.stdout and "read-only file system" in proc.stderr.lower(), \
        proc.stderr[-3000:]


def test_the_gpu_benchmark_says_in_one_line_that_it_needs_a_gpu_and_fails_without_one():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU visible, on any machine
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py")], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env=env)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "needs a GPU" in lines[0] and "Traceback" not in done.stderr, done.stderr
