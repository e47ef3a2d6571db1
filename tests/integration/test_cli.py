"""The command line: every sub-command parses, and bad input ends in one clear line and a
non-zero exit status, never a traceback."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lens_position.cli.commands import EXIT_ERROR, EXIT_USAGE, build_parser, main
from lens_position.pipeline.config import DEFAULT_MODELS
from lens_position.pipeline.steps import commands

COMMAND_STEPS = commands()


def _run_main(capsys, argv):
    try:
        status = main(argv)
    except SystemExit as exit_:  # argparse exits for bad options
        status = exit_.code
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _assert_one_line_error(err: str, *needles: str) -> None:
    assert "Traceback" not in err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("lens-position")
    for needle in needles:
        assert needle.lower() in lines[0].lower(), lines[0]


def test_parser_has_every_experiment_subcommand_with_data_options():
    parser = build_parser()
    for command in ("decompose", "bos", "sinks", "fingerprint", "probe"):
        args = parser.parse_args([command, "tiny-llama", "--source", "random", "--bos", "none", "--T", "24",
                                  "--N", "3", "--seed", "5", "--out", "x", "--quick"])
        assert (args.command, args.model, args.source, args.bos, args.T, args.N, args.seed, args.quick) == (
            command, "tiny-llama", "random", "none", 24, 3, 5, True)
        assert args.out == Path("x")
        assert set(COMMAND_STEPS[command]) <= set(COMMAND_STEPS["reproduce"])


def test_reproduce_defaults_to_the_three_architectures_and_the_zoo():
    args = build_parser().parse_args(["reproduce"])
    assert tuple(args.models.split(",")) == (*DEFAULT_MODELS, "zoo")
    assert DEFAULT_MODELS == ("smollm2-135m", "smollm2-135m-ntk", "smollm2-135m-ntk-parts", "gemma3-270m")
    assert args.out == Path("results") and args.browser_check and not args.quick


def test_unknown_model_is_a_one_line_error(capsys, tmp_path):
    status, _, err = _run_main(capsys, ["decompose", "no-such-model", "--out", str(tmp_path)])
    assert status == EXIT_ERROR
    _assert_one_line_error(err, "unknown model", "no-such-model", "tiny-llama")


def test_unknown_model_in_reproduce_list_fails_before_any_work(capsys, tmp_path):
    out = tmp_path / "out"
    status, _, err = _run_main(capsys, ["reproduce", "--models", "tiny-llama,gpt-17", "--out", str(out)])
    assert status == EXIT_ERROR
    _assert_one_line_error(err, "gpt-17")
    assert not out.exists()


def test_T_beyond_the_context_is_a_one_line_error(capsys, tmp_path):
    status, _, err = _run_main(capsys, ["decompose", "tiny-llama", "--T", "100000", "--no-progress",
                                        "--out", str(tmp_path)])
    assert status == EXIT_ERROR
    _assert_one_line_error(err, "100000", "context")


def test_unwritable_output_folder_is_a_one_line_error(capsys, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    status, _, err = _run_main(capsys, ["decompose", "tiny-llama", "--out", str(blocker / "sub")])
    assert status == EXIT_ERROR
    _assert_one_line_error(err, "cannot write to the output folder")


@pytest.mark.parametrize("argv, needle", [
    (["decompose", "tiny-llama", "--T", "abc"], "whole number"),
    (["decompose", "tiny-llama", "--N", "0"], "positive"),
    (["decompose", "tiny-llama", "--source", "poetry"], "invalid choice"),
    (["reproduce", "--format", "xlsx"], "invalid choice"),
    (["frobnicate"], "invalid choice"),
    ([], "required"),
    (["decompose"], "required"),
])
def test_bad_options_are_a_one_line_error(capsys, argv, needle):
    status, _, err = _run_main(capsys, argv)
    assert status == EXIT_USAGE
    _assert_one_line_error(err, needle)


def test_bad_bos_policy_is_a_one_line_error(capsys, tmp_path):
    status, _, err = _run_main(capsys, ["decompose", "tiny-llama", "--bos", "sometimes", "--no-progress",
                                        "--quick", "--out", str(tmp_path)])
    assert status == EXIT_ERROR
    _assert_one_line_error(err, "sometimes")


def test_console_script_exits_non_zero_without_traceback(tmp_path):
    script = shutil.which("lens-position") or str(Path(sys.executable).parent / "lens-position")
    proc = subprocess.run([script, "probe", "not-a-model", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == EXIT_ERROR
    _assert_one_line_error(proc.stderr, "unknown model")


def test_decompose_restricted_by_layers_queries_and_keys_writes_only_those(capsys, tmp_path):
    import json

    import pandas as pd

    out = tmp_path / "dec"
    status, stdout, err = _run_main(capsys, [
        "decompose", "tiny-llama", "--quick", "--no-progress", "--T", "24", "--N", "3", "--layers", "0,2",
        "--query-range", "4:20", "--keys", "no-bos", "--batch-size", "2", "--out", str(out), "--json"])
    assert status == 0, err
    summary = json.loads(stdout)
    assert summary["command"] == "decompose" and Path(summary["out"]) == out
    heads = pd.read_parquet(summary["files"]["decompose_heads"])
    assert sorted(heads["layer"].unique().tolist()) == [0, 2]
    assert set(zip(heads["query_start"], heads["query_stop"])) == {(4, 20)}
    assert set(heads["key_set"]) == {"no-bos"}


def test_each_subcommand_writes_to_its_own_folder_by_default(monkeypatch, tmp_path):
    from lens_position.cli.commands import _config

    monkeypatch.chdir(tmp_path)
    parser = build_parser()
    outs = {command: _config(parser.parse_args([command, "tiny-llama"]), []).out
            for command in ("decompose", "bos", "sinks", "fingerprint", "probe")}
    outs["reproduce"] = _config(parser.parse_args(["reproduce"]), []).out
    assert len(set(outs.values())) == len(outs), outs
    assert outs["reproduce"] == Path("results") and outs["decompose"] == Path("results-decompose")


@pytest.mark.parametrize("argv,needle", [
    (["decompose", "tiny-llama", "--layers", "a,b"], "layer indices"),
    (["decompose", "tiny-llama", "--query-range", "20:4"], "START < STOP"),
    (["decompose", "tiny-llama", "--keys", "some"], "invalid choice"),
    (["decompose", "tiny-llama", "--batch-size", "0"], "positive"),
])
def test_bad_analysis_options_are_a_one_line_error(capsys, argv, needle):
    status, _, err = _run_main(capsys, argv)
    assert status == EXIT_USAGE
    _assert_one_line_error(err, needle)


def test_the_parser_and_help_do_not_import_transformer_lens():
    """`lens-position --help` (and any argument error) must not wait for TransformerLens."""
    code = ("import sys\nimport lens_position\nfrom lens_position.cli.commands import "
            "build_parser\nbuild_parser().format_help()\n"
            "from lens_position.models import KNOWN_MODELS\nassert KNOWN_MODELS\n"
            "print(sorted(m for m in ('transformer_lens', 'lens_position.pipeline.runner') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    # the lazy names still resolve, and only to what they named before
    import lens_position.models as models
    from lens_position.models.load import load_model

    assert models.load_model is load_model and "load_model" in dir(models)
    import lens_position

    assert lens_position.load_model is load_model  # `from lens_position import load_model` works too
    with pytest.raises(AttributeError, match="no attribute 'decompose_everything'"):
        lens_position.decompose_everything  # noqa: B018
    assert sorted(models.__all__) == sorted(models._EXPORTS)  # the static list names every lazy export
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        models.nope  # noqa: B018


@pytest.mark.parametrize("command, printed", [
    ("decompose", ["of it is the causal mask's (M' = ", "the residual stream's (R' = "]),
    ("sinks", ["attention sink", "sink readers"]),
    ("leakage", ["positional leakage ΔR²", "Benjamini-Hochberg", "Jaccard", "cannot see the mask component"]),
])
def test_each_subcommand_prints_its_own_headline_numbers(capsys, tmp_path, command, printed):
    import pandas as pd

    out = tmp_path / command
    status, stdout, err = _run_main(capsys, [command, "tiny-llama", "--quick", "--no-progress", "--T", "24", "--N", "4",
                                             "--batch-size", "2", "--out", str(out)])
    assert status == 0, err
    flat = " ".join(stdout.split())  # the sentences are wrapped at 110 columns
    for text in printed:
        assert text in flat, stdout
    assert "not measured" not in stdout and "random weights" in flat
    assert stdout.splitlines()[0].startswith("Quick run (N = 4, T = 24, ")  # a quick run says so first
    if command == "decompose":  # the printed R' is the table's, to 3 significant figures
        layers = pd.read_parquet(out / "decompose_layers.parquet")
        assert f"R' = {layers['R_rf_heldout'].mean():.3g}" in flat


@pytest.mark.parametrize("command, model, printed", [
    ("bands", "zoo:window-mix", ["splits by RoPE band as band 0", "The split is exact to"]),
    ("bands", "zoo:nope", ["rotary_bands skipped on zoo:nope: the model has no rotary embedding"]),
    ("leakage", "zoo:nope", ["leakage skipped on zoo:nope: the model has no rotary embedding"]),
    ("bos", "zoo:learned", ["replaced position-0 state", "BOS replacement removes"]),
    ("sinks", "zoo:window-mix", ["local layers:", "window-aware", "global layers:"]),
])
def test_the_instruments_run_on_zoo_models_and_say_what_they_measured(capsys, tmp_path, command, model, printed):
    """Position-0 convergence (with BOS replacement), the window-aware sinks and the rotary bands
    on shipped zoo checkpoints: each prints its sentence, and a step that does not apply says why."""
    status, stdout, err = _run_main(capsys, [command, model, "--quick", "--no-progress", "--N", "4",
                                             "--batch-size", "4", "--out", str(tmp_path / command)])
    assert status == 0, err
    flat = " ".join(stdout.split())  # the sentences are wrapped at 110 columns
    for text in printed:
        assert text in flat, stdout


def test_no_progress_silences_the_other_libraries_bars_while_it_runs(monkeypatch, capsys, tmp_path):
    """--no-progress reaches transformers' and the hub's bars (those drawn while a GGUF file is
    dequantised or weights load) for the command's duration, and puts every switch back."""
    import importlib

    from huggingface_hub.utils import are_progress_bars_disabled
    from transformers.utils import logging as hf_logging

    pipeline_run = importlib.import_module("lens_position.pipeline.runner")  # the module, not its run()

    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    seen = []
    real_run = pipeline_run.run

    def spying_run(config, **kwargs):
        from transformers import modeling_gguf_pytorch_utils as gguf_reader

        seen.append((hf_logging.is_progress_bar_enabled(), are_progress_bars_disabled(),
                     type(hf_logging.tqdm(range(2))).__name__, os.environ.get("TQDM_DISABLE"),
                     gguf_reader.tqdm(range(2), file=io.StringIO()).disable))
        return real_run(config, **kwargs)

    monkeypatch.setattr(pipeline_run, "run", spying_run)
    assert main(["decompose", "tiny-llama", "--quick", "--out", str(tmp_path / "on")]) == 0
    assert main(["decompose", "tiny-llama", "--quick", "--no-progress", "--out", str(tmp_path / "off")]) == 0
    assert seen[0][:2] == (True, False) and seen[0][3] is None and not seen[0][4]
    assert seen[1] == (False, True, "EmptyTqdm", "1", True)  # the GGUF reader's own bar too
    assert hf_logging.is_progress_bar_enabled() and not are_progress_bars_disabled()  # put back
    assert "TQDM_DISABLE" not in os.environ
    from transformers import modeling_gguf_pytorch_utils as gguf_reader

    assert not gguf_reader.tqdm(range(2), file=io.StringIO()).disable
    capsys.readouterr()


def test_the_reports_wall_time_counts_from_the_commands_start(capsys, tmp_path, monkeypatch):
    """What happens before the run (parsing, the early checks, the imports) is in the wall time."""
    import json
    import time

    from lens_position.cli import commands as cli

    checked = cli.preflight

    def slow_checks(args):
        time.sleep(1.0)
        checked(args)

    monkeypatch.setattr(cli, "preflight", slow_checks)
    started = time.perf_counter()
    status, _, err = _run_main(capsys, ["bands", "tiny-llama", "--quick", "--no-progress", "--out", str(tmp_path)])
    took = time.perf_counter() - started
    assert status == 0, err
    wall = json.loads((tmp_path / "provenance.json").read_text())["wall_time_s"]
    assert 1.0 <= wall <= took
