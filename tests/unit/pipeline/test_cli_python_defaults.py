"""Python and the command line agree on every option and default.

Each command-line option that has a Python counterpart is a row of ``COUNTERPARTS``: the value
the pipeline runs with when the option is not given (read from the parsed command line through
``RunConfig.settings()``, so a ``None`` default resolves to what the run really uses) must equal
the default of every Python parameter it corresponds to. Every option of every sub-command is
either in that table or in ``NO_PYTHON_COUNTERPART``, so a new option cannot slip past.
"""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable
from typing import Any

import pytest

import lens_position as lp
from lens_position.analyses.convergence import position0_convergence
from lens_position.analyses.length_sweep import length_sweep
from lens_position.analyses.prompt_sets import across_prompt_sets
from lens_position.analyses.rotary_bands import rotary_bands
from lens_position.analyses.sinks import window_sinks
from lens_position.cli.commands import _config, build_parser
from lens_position.core.intervals import Bootstrap
from lens_position.core.stream import BATCH_SIZE, stream
from lens_position.pipeline.config import Compute, DataOptions, RunConfig

# The analyses each sub-command's steps call (lens_position.pipeline.steps), and analyze().
STEP_FUNCTIONS: tuple[Callable, ...] = (
    lp.decompose, lp.position_probe, lp.bos_replacement, position0_convergence, lp.sink_heads, lp.sink_rate,
    lp.sink_reading_heads, window_sinks, rotary_bands, lp.fingerprint, across_prompt_sets, lp.analyze, stream,
)


def _cli_effective(command: str) -> tuple[argparse.Namespace, RunConfig, Any]:
    """What a sub-command runs with when no option is given: the parsed options, the config, its sizes."""
    argv = [command] if command == "reproduce" else [command, "tiny-llama"]
    args = build_parser().parse_args(argv)
    config = _config(args, argv)
    return args, config, config.settings()


def _default(function: Callable, name: str) -> Any:
    return inspect.signature(function).parameters[name].default


def _with(name: str) -> list[Callable]:
    """Every step function that takes the parameter ``name``."""
    return [f for f in STEP_FUNCTIONS if name in inspect.signature(f).parameters]


# option dest -> (what the CLI runs with, given (args, config, settings)), [(python function, parameter)]
COUNTERPARTS: dict[str, tuple[Callable[[Any, RunConfig, Any], Any], list[tuple[Callable, str]]]] = {
    "batch_size": (lambda a, c, s: s.batch_size, [(f, "batch_size") for f in _with("batch_size")]),
    "progress": (lambda a, c, s: c.progress, [(f, "progress") for f in _with("progress")]),
    "device": (lambda a, c, s: c.compute.device, [(lp.load_model, "device")]),
    "dtype": (lambda a, c, s: c.compute.dtype, [(lp.load_model, "dtype")]),
    "n_devices": (lambda a, c, s: c.compute.n_devices, [(lp.load_model, "n_devices")]),
    "backend": (lambda a, c, s: c.compute.backend, [(lp.load_model, "backend")]),
    "source": (lambda a, c, s: c.data.source,
               [(lp.build_prompts, "source")] + [(f, "source") for f in _with("source")]),
    "bos": (lambda a, c, s: c.data.bos, [(lp.build_prompts, "bos"), (lp.sink_rate, "bos"),
                                         (across_prompt_sets, "bos")]),
    "seed": (lambda a, c, s: c.data.seed, [(f, "seed") for f in _with("seed")] + [(lp.build_prompts, "seed")]),
    "corpus": (lambda a, c, s: c.data.corpus,
               [(lp.build_prompts, "corpus")] + [(f, "corpus") for f in _with("corpus")]),
    "T": (lambda a, c, s: s.T, [(lp.build_prompts, "T"), (across_prompt_sets, "T")]),
    "N": (lambda a, c, s: s.N, [(lp.build_prompts, "N"), (lp.fingerprint, "N"), (lp.sink_rate, "N"),
                                (across_prompt_sets, "N")]),
    "layers": (lambda a, c, s: s.layers, [(lp.decompose, "layers"), (lp.position_probe, "layers")]),
    "keys": (lambda a, c, s: s.keys, [(lp.decompose, "keys")]),
    "lengths": (lambda a, c, s: s.lengths, [(length_sweep, "lengths")]),
}
# The early queries of BOS replacement and sink reading (--query-range's default for those steps)
# and the decomposition's query range (all queries) are two defaults of one option.
QUERY_RANGE = [
    (lambda s: s.query_range, lp.bos_replacement, "query_range"),
    (lambda s: s.query_range, lp.sink_reading_heads, "query_range"),
    (lambda s: (0, s.query_range[1]), lp.analyze, "early_queries"),
    (lambda s: s.decompose_queries, lp.decompose, "query_range"),
]
# Run-level options with no parameter in the Python API (where to write, how to print, executors).
NO_PYTHON_COUNTERPART = {
    "help", "debug", "command", "models", "model", "spec", "out", "force", "json", "fmt", "use_cache",
    "browser_check", "executor", "ray_address", "quick",
    # torch.set_num_threads in Python; the CLI sets it per model
    "threads",
    # off by default on the command line; in Python, calling across_prompt_sets is the opt-in (K sets)
    "prompt_sets",
}


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


ANALYSIS_COMMANDS = ("reproduce", "decompose", "bos", "sinks", "fingerprint", "probe", "bands")


def _rows() -> list[Any]:
    rows = []
    for dest, (_, pairs) in COUNTERPARTS.items():
        for function, parameter in pairs:
            name = getattr(function, "__name__", "?")
            rows.append(pytest.param(dest, function, parameter, id=f"--{dest}={name}.{parameter}"))
    return rows


@pytest.mark.parametrize("dest,function,parameter", _rows())
def test_a_cli_option_and_its_python_parameter_have_the_same_default(dest, function, parameter):
    cli_value, _ = COUNTERPARTS[dest]
    for command in ANALYSIS_COMMANDS:
        args, config, settings = _cli_effective(command)
        value = cli_value(args, config, settings)
        python = _default(function, parameter)
        if isinstance(python, tuple) or isinstance(value, tuple):
            value, python = tuple(value) if value is not None else None, tuple(python) if python is not None else None
        assert value == python, (
            f"{command} --{dest}: the command line runs with {value!r}, {function.__name__}"
            f"({parameter}=...) defaults to {python!r}"
        )


@pytest.mark.parametrize("settings_of,function,parameter", QUERY_RANGE,
                         ids=[f"{f.__name__}.{p}" for _, f, p in QUERY_RANGE])
def test_the_query_range_defaults_agree(settings_of, function, parameter):
    _, _, settings = _cli_effective("reproduce")
    python = _default(function, parameter)
    expected = settings_of(settings)
    if parameter == "early_queries":
        assert (0, python) == expected
    else:
        assert (tuple(python) if python is not None else None) == (tuple(expected) if expected is not None else None)


def test_the_bootstrap_and_the_sink_threshold_are_the_same_in_both():
    _, _, settings = _cli_effective("reproduce")
    assert settings.n_resamples == Bootstrap().n_resamples
    assert settings.eps == _default(lp.sink_heads, "eps") == _default(lp.analyze, "eps")
    assert settings.batch_size == BATCH_SIZE
    # Gu et al.'s T = 64 set-up of the sink steps and the fingerprint
    assert settings.sink_T == _default(lp.fingerprint, "T") == _default(lp.sink_rate, "T")


def test_the_compute_and_data_dataclasses_default_like_load_model_and_build_prompts():
    compute, data = Compute(), DataOptions()
    for field in ("device", "dtype", "n_devices", "backend"):
        assert getattr(compute, field) == _default(lp.load_model, field), field
    for field in ("source", "bos", "seed", "corpus"):
        assert getattr(data, field) == _default(lp.build_prompts, field), field


def test_every_cli_option_is_either_matched_to_python_or_declared_without_a_counterpart():
    known = set(COUNTERPARTS) | NO_PYTHON_COUNTERPART | {"query_range"}
    unclassified = {}
    for name, sub in _subcommands().items():
        dests = {a.dest for a in sub._actions if a.dest is not argparse.SUPPRESS}
        if name == "zoo":
            continue  # trains and lists models: no analysis option
        missing = dests - known
        if missing:
            unclassified[name] = sorted(missing)
    assert not unclassified, f"options without a row in COUNTERPARTS or NO_PYTHON_COUNTERPART: {unclassified}"


def test_the_batch_size_help_states_the_shared_default():
    sub = _subcommands()["decompose"]
    action = next(a for a in sub._actions if a.dest == "batch_size")
    assert f"default: {BATCH_SIZE}" in action.help


@pytest.mark.parametrize("text,expected", [("128,512", (128, 512)), ("8192, 128,128", (128, 8192))])
def test_lengths_on_the_command_line_become_the_sweeps_grid(text, expected):
    import dataclasses

    from lens_position.models.toy import random_model
    from lens_position.pipeline.steps import length_sweep as step

    argv = ["decompose", "tiny-llama", "--lengths", text]
    config = _config(build_parser().parse_args(argv), argv)
    assert config.settings().lengths == expected
    spec = dataclasses.replace(random_model(n_layers=1).spec, n_ctx=1024)
    assert step.sizes(config.settings(), spec).lengths == tuple(T for T in sorted({*expected, config.settings().T})
                                                                 if T <= spec.n_ctx)


@pytest.mark.parametrize("text", ["1", "0,128", "-4", "12x", "128,,512", ""])
def test_a_bad_length_grid_is_refused_by_the_parser(text, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["decompose", "tiny-llama", "--lengths", text])
    assert "--lengths" in capsys.readouterr().err
