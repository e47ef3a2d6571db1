"""A command line that checks first: each bad command line below fails in a fresh process before
TransformerLens is imported (so before any weight is read: every model is built through it), with
one error, printed once, in command-line words (flags and ``model@option=value``, never Python
keywords, calls or exception names).

Bad input is grouped by class: unknown names (models, sub-commands, sources, options, zoo
checkpoints), values out of range for a model's config (layers, T), sizes too small for a step,
files that are missing or not what they claim, and malformed values."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

RUN = """
import sys
from lens_position.cli.commands import main
try:
    status = main(sys.argv[1:])
except SystemExit as stop:
    status = stop.code
print("transformer_lens imported:", "transformer_lens" in sys.modules, file=sys.stderr)
sys.exit(status)
"""

# Python's words, which a command-line user cannot type: calls, keyword arguments, exception names
PYTHON_WORDS = re.compile(r"Traceback|load_model\(|\boffline=|\bbackend='|\(\.\.\.,|\b[A-Z]\w*Error\b|"
                          r"invalid literal for|kwargs|\bNone\b")

BAD = [
    # unknown names, with the nearest known one
    (["decompose", "smollm3-135m"], "Did you mean 'smollm2-135m'"),
    (["reproduce", "--models", "smollm2-135m,gema3-270m"], "Did you mean 'gemma3-270m'"),
    (["decompse", "tiny-llama"], "did you mean 'decompose'"),
    (["decompose", "tiny-llama", "--source", "naturall"], "did you mean 'natural'"),
    (["decompose", "tiny-llama", "--executor", "rey"], "did you mean 'ray'"),
    (["decompose", "tiny-llama@ntk_alfa=2"], "did you mean 'ntk_alpha'"),
    (["reproduce", "--models", "zoo:ropee"], "did you mean 'zoo:rope'"),
    (["decompose", "HuggingFaceTB/SmolLM2-135M"], "--local-dir FOLDER"),
    (["reproduce", "--models", "tiny-llama,tiny-llama"], "listed twice"),
    # what the model's config rules out
    (["decompose", "tiny-llama", "--layers", "5"], "tiny-llama has 3 layers"),
    (["decompose", "smollm2-135m", "--layers", "40"], "smollm2-135m has 30 layers"),
    (["decompose", "tiny-llama", "--T", "5000"], "tiny-llama@n_ctx=5000"),
    (["reproduce", "--models", "tiny-llama,smollm2-135m", "--T", "9000"], "use --T 1024 or less"),
    (["decompose", "smollm2-135m@n_ctx=4096", "--T", "5000"], "n_ctx = 4096"),
    # sizes a step cannot measure on
    (["probe", "tiny-llama", "--N", "2"], "--N 3"),
    (["sinks", "tiny-llama", "--bos", "none"], "--bos force"),
    (["decompose", "tiny-llama", "--prompt-sets", "1"], "at least 2"),
    (["decompose", "tiny-llama", "--batch-size", "0"], "positive"),
    # files that are missing or are not what they claim
    (["decompose", "{tmp}/missing.gguf"], "no such file"),
    (["decompose", "{tmp}/junk.gguf"], "is not a GGUF file"),
    (["decompose", "tiny-llama", "--text", "{tmp}/missing.txt"], "does not exist"),
    (["decompose", "tiny-llama", "--out", "{tmp}/a-file"], "choose another --out"),
    (["sweep", "{tmp}/missing.toml"], "does not exist"),
    # malformed values
    (["decompose", "tiny-llama@window=abc"], "window takes a whole number, e.g. tiny-llama@window=64"),
    (["decompose", "tiny-llama", "--layers", "3:1"], "--layers"),
    (["decompose", "tiny-llama", "--query-range", "10:5"], "START < STOP"),
    (["decompose", "tiny-llama", "--seed", "-1"], "0..2**63-1"),
    (["decompose", "tiny-llama", "--bos", "bogus"], "unknown BOS policy"),
    (["decompose", "tiny-llama", "--device", "cuda"], "--device cpu"),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bad-input")
    (folder / "junk.gguf").write_bytes(b"junk" * 64)
    (folder / "a-file").write_text("not a folder")
    return folder


@pytest.mark.parametrize(("argv", "expected"), BAD, ids=[" ".join(argv) for argv, _ in BAD])
def test_a_bad_command_line_fails_before_any_model_with_one_error_in_its_own_words(argv, expected, files, tmp_path):
    argv = [arg.replace("{tmp}", str(files)) for arg in argv]
    if "--out" not in argv and argv[0] != "sweep":
        argv += ["--out", str(tmp_path / "out")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", RUN, *argv], capture_output=True, text=True, env=env, timeout=120)
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert done.returncode in (1, 2), done.stderr[-2000:]
    assert len(errors) == 1, done.stderr  # printed once, one line
    assert expected in errors[0]
    assert not PYTHON_WORDS.search(errors[0]), errors[0]
    assert "internal error" not in errors[0]
    assert "transformer_lens imported: False" in done.stderr  # no model was built, so no weight was read
    assert not (tmp_path / "out").exists()


def test_there_are_at_least_twenty_bad_command_lines_of_every_class():
    assert len(BAD) >= 20


@pytest.mark.parametrize("command", ["decompose", "probe", "bos", "sinks", "bands", "leakage", "fingerprint"])
def test_each_sub_commands_help_describes_its_own_quick_run(command, capsys):
    from lens_position.cli.commands import build_parser
    from lens_position.pipeline.steps import commands

    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices[command]
    quick = next(action.help for action in sub._actions if "--quick" in action.option_strings)
    assert f"a quick {command}" in quick
    assert all(step in quick for step in commands()[command])  # its own steps, with their sizes
    others = {step for steps in commands().values() for step in steps} - set(commands()[command])
    assert not any(re.search(rf"\b{step}\b", quick) for step in others)
    assert "zoo" not in quick  # the reproduction's zoo seeds are not this command's
