"""The ``lens-position`` command line: argument parsing only; the work is in ``lens_position.pipeline``.

``lens-position reproduce`` runs claims C1-C5 on the embedded default models and writes an
output folder (tables, claims, provenance, ``report.html`` and its screenshot). The other
sub-commands run one experiment on one model. Bad input ends with a one-line error and a
non-zero exit status, never a traceback (``--debug`` shows it).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import re
import shlex
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from lens_position.cli.argtypes import path_option, positive_int, seed_option
from lens_position.ground.errors import BadInputError, LensPositionError, is_input_error
from lens_position.ground.files import resource_error

# Exit statuses: 1 = a problem with the input or environment, 2 = bad options (argparse's),
# 3 = an internal error (a bug: please report it), 130 = interrupted.
EXIT_ERROR, EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED = 1, 2, 3, 130


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad options in one line (and exits 2) instead of usage + message."""

    def error(self, message: str) -> None:  # type: ignore[override]
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:
            import difflib

            near = difflib.get_close_matches(choice[1], re.findall(r"'([^']*)'", choice[2]), n=1, cutoff=0.6)
            if near:
                message += f"; did you mean {near[0]!r}?"
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _prompt_set_count(text: str) -> int:
    value = positive_int(text) if text.strip() != "0" else 0
    if value == 1:
        raise argparse.ArgumentTypeError("the spread between prompt sets needs at least 2 sets (0: off)")
    return value


def _layer_list(text: str) -> tuple[int, ...]:
    """``0,4,8`` or ``2:6`` (layers 2 to 5), or both mixed: ``0,2:4`` (as Python's ``layers="2:6"``)."""
    from lens_position.core.checks import parse_layers

    try:
        return tuple(parse_layers(text))
    except BadInputError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _length_list(text: str) -> tuple[int, ...]:
    """``128,512,2048``: the length sweep's grid, each length a whole number >= 2 (a decomposition
    needs a query with an earlier key)."""
    lengths = []
    for part in text.split(","):
        value = positive_int(part.strip())
        if value < 2:
            raise argparse.ArgumentTypeError(f"a length must be at least 2 positions, got {value}")
        lengths.append(value)
    return tuple(sorted(set(lengths)))


def _query_range(text: str) -> tuple[int, int]:
    """``START:STOP``: queries ``START <= i < STOP``."""
    try:
        start, stop = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected START:STOP (e.g. 0:32), got {text!r}") from None
    if not 0 <= start < stop:
        raise argparse.ArgumentTypeError(f"expected 0 <= START < STOP, got {text!r}")
    return start, stop


def _out_folder(text: str) -> Path:
    if not text.strip():
        raise argparse.ArgumentTypeError("the output folder is the empty path; name a folder (--out DIR)")
    return path_option(text)


def _text_source(text: str) -> str:
    """``--text``: a file, a folder or ``hf:...``, never the empty path (the current folder)."""
    if not text.startswith("hf:"):
        path_option(text)
    return text


def _add_common(sub: argparse.ArgumentParser, *, many_models: bool, out: Path,
                analysis_options: set[str] | None = None, command: str = "reproduce") -> None:
    from lens_position.models.registry import DEFAULT_MODELS
    from lens_position.pipeline.steps import command_options

    wanted = command_options("reproduce") if analysis_options is None else analysis_options

    if many_models:
        # The zoo's 24 models are tiny (about 5 s of CPU each for every step at the full sizes), so
        # the default run includes them: the report's zoo section answers C3 where nothing but the
        # position mechanism differs.
        sub.add_argument("--models", default=",".join([*DEFAULT_MODELS, "zoo"]), metavar="NAMES",
                         help="comma-separated registry names or paths, each optionally with load "
                              "options after '@' (tiny-llama@ntk_alpha=8, x@ntk_by_parts, x@window=64), "
                              "zoo:<variant>[:seed<k>] for a controlled-zoo model, or zoo for all of them "
                              "(default: the three embedded architectures and every shipped zoo model, "
                              "%(default)s)")
    else:
        sub.add_argument("model", metavar="MODEL",
                         help="a registry name (e.g. smollm2-135m, gemma3-270m, tiny-llama), a .gguf file "
                              "or a local Hugging Face checkpoint folder, optionally with load options "
                              "after '@' (smollm2-135m@ntk_alpha=4)")
    data = sub.add_argument_group("data")
    data.add_argument("--source", choices=("natural", "random", "repeated"), default="natural",
                      help="natural text, random tokens or a repeated token (default: %(default)s)")
    data.add_argument("--text", dest="corpus", type=_text_source, metavar="PATH", default=None,
                      help="natural text: a text file, a folder of .txt/.md/.rst files or "
                           "hf:<dataset>:<split>[:<column>] from the local cache (default: CPython's pydoc topics)")
    data.add_argument("--bos", default="force", metavar="POLICY",
                      help="token 0: tokenizer (the tokenizer's own), force, none, or token:<id or text> "
                           "(default: %(default)s, so every model has a BOS to study)")
    data.add_argument("--T", type=positive_int, default=None, metavar="T",
                      help="positions per sequence, position 0 included (default: 128, 40 with --quick; "
                           "sliding-window models use at least 1.25 × their window)")
    data.add_argument("--N", type=positive_int, default=None, metavar="N",
                      help="number of sequences, for every step when given (default: 16; BOS replacement and "
                           "sink reading 16, probes enough for 2048 positions; 4 with --quick)")
    data.add_argument("--seed", type=seed_option, default=0,
                      help="seed for data and random replacements, 0..2**63-1 (default: 0)")
    _add_analysis(sub, wanted)
    _add_run(sub, out, command)
    _add_compute(sub)


def _add_analysis(sub: argparse.ArgumentParser, wanted: set[str]) -> None:
    analysis = sub.add_argument_group("analysis")
    sub.set_defaults(layers=None, query_range=None, keys=None, prompt_sets=0, lengths=None)
    if "layers" in wanted:
        analysis.add_argument("--layers", type=_layer_list, default=None, metavar="LAYERS",
                              help="layers to analyse, e.g. 0,4,8 or 2:6 = layers 2 to 5, as Python's "
                                   "layers=\"2:6\" (decomposition and probes; default: all)")
    if "query_range" in wanted:
        analysis.add_argument("--query-range", dest="query_range", type=_query_range, default=None,
                              metavar="START:STOP",
                              help="queries START <= i < STOP: the decomposition's (default: all) and the early "
                                   "queries of BOS replacement and sink reading (default: 0:32)")
    if "keys" in wanted:
        analysis.add_argument("--keys", choices=("all", "no-bos"), default=None,
                              help="keys in the decomposition's fits: all, or all but position 0 (default: all)")
    if "prompt_sets" in wanted:
        analysis.add_argument("--prompt-sets", dest="prompt_sets", type=_prompt_set_count, default=0, metavar="K",
                              help="also measure C1's and C2's numbers on K disjoint prompt sets of N sequences "
                                   "and report their spread beside the bootstrap's (opt-in: K more decomposition "
                                   "passes per model; default: off)")
    if "lengths" in wanted:
        analysis.add_argument("--lengths", type=_length_list, default=None, metavar="T1,T2,...",
                              help="the length sweep's grid: each model is decomposed at every length that fits its "
                                   "context, and C3 is compared at every length both sides share (e.g. "
                                   "128,512,2048,8192,32768 up to each model's context; default: 32,...,1024, "
                                   "16,80 with --quick); each length costs N passes of that length per model")
    from lens_position.core.stream import BATCH_SIZE

    analysis.add_argument("--batch-size", dest="batch_size", type=positive_int, default=None, metavar="B",
                          help=f"sequences per forward pass (default: {BATCH_SIZE}, as in Python); memory grows "
                               "with it")


def _quick_help(command: str) -> str:
    """``--quick``'s help for ``command``: what its own steps run at (the reproduction's also says how
    long it takes, as measured)."""
    if command == "reproduce":
        return ("a quick run of every step on every model (T=40, N=4; sliding-window models at 1.25 x their "
                "window; probes on 160 positions; 16 early queries; sink steps at T=32; the zoo's seeds 0 and 1 "
                "only): 50 bootstrap replicates; about 2.5 min of 2 cores once the weights are cached, 3.3 min for "
                "the first run, which caches them (measured: docs/performance.md)")
    from lens_position.pipeline.config import FULL, QUICK
    from lens_position.pipeline.steps import quick_sizes

    return (f"a quick {command} at small sizes, {QUICK.n_resamples} bootstrap replicates instead of "
            f"{FULL.n_resamples}: {quick_sizes(command)} (sliding-window models at least {QUICK.window_factor:g} x "
            "their window)")


def _add_run(sub: argparse.ArgumentParser, out: Path, command: str = "reproduce") -> None:
    run = sub.add_argument_group("run")
    run.add_argument("--out", type=_out_folder, default=out, metavar="DIR",
                     help="output folder (default: %(default)s; each sub-command has its own, so none rewrites "
                          "another's report); finished steps cached in DIR/cache are reused")
    run.add_argument("--force", action="store_true",
                     help="write into a non-empty folder that holds no earlier run (its files are kept; only "
                          "files of the same name are replaced)")
    run.add_argument("--json", dest="json", action="store_true",
                     help="print what was written (files, claims) as one JSON object instead of a summary")
    run.add_argument("--quick", action="store_true", help=_quick_help(command))
    run.add_argument("--format", dest="fmt", choices=("parquet", "csv"), default="parquet",
                     help="table format (default: %(default)s)")
    run.add_argument("--no-cache", dest="use_cache", action="store_false",
                     help="recompute every step even if a cached result exists")
    run.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")


def _add_compute(sub: argparse.ArgumentParser) -> None:
    compute = sub.add_argument_group("compute")
    compute.add_argument("--executor", choices=("serial", "ray"), default="serial",
                         help="serial: one model after another here; ray: an actor per model, steps as tasks "
                              "(pip install 'lens_position[ray]') (default: %(default)s)")
    compute.add_argument("--ray-address", default=None, metavar="ADDRESS",
                         help="join a running Ray cluster (e.g. auto or ray://head:10001) instead of starting "
                              "a local one; only the driver writes --out")
    compute.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu",
                         help="where models run (auto: cuda when torch sees a GPU) (default: %(default)s)")
    compute.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                         help="weights and activations; the decomposition's statistics stay float64 "
                              "(default: %(default)s)")
    compute.add_argument("--n-devices", type=positive_int, default=1, metavar="K",
                         help="split each model over K GPUs (TransformerLens n_devices; with --device cuda)")
    compute.add_argument("--backend", choices=("auto", "hooked", "bridge"), default="auto",
                         help="model backend: hooked (HookedTransformer, TransformerLens 3.x), bridge "
                              "(TransformerBridge, TransformerLens 3.9 and 4.x), auto: hooked where it exists "
                              "(default: %(default)s)")
    compute.add_argument("--threads", type=positive_int, default=None, metavar="K",
                         help="torch CPU threads per model (default: torch's own; a Ray actor's CPUs)")


def build_parser() -> argparse.ArgumentParser:
    """The ``lens-position`` argument parser (also read by the docs' command line reference)."""
    parser = _Parser(
        prog="lens-position",
        description="Where does absolute position come from in decoder-only transformers? "
                    "Reproduce arXiv 2606.06160's claims C1-C5 with a mask/residual decomposition "
                    "of attention, probes and interventions.",
    )
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    subs = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    subs.required = True

    rep = subs.add_parser("reproduce", help="run every claim on the default architectures and write a report",
                          description="Run claims C1-C5 on standard RoPE (smollm2-135m), NTK-scaled RoPE "
                                      "(smollm2-135m-ntk, smollm2-135m-ntk-parts) and sliding-window "
                                      "attention (gemma3-270m, T > 512), and on every model of the controlled "
                                      "zoo (its own section of the report: C3 from paired seeds), and write "
                                      "tables, provenance, report.html and a browser screenshot of it to --out.")
    _add_common(rep, many_models=True, out=Path("results"))
    rep.add_argument("--no-browser-check", dest="browser_check", action="store_false",
                     help="do not open the report in headless Chromium (no screenshot)")

    helps = {
        "decompose": "mask/residual decomposition of attention per head and layer (C1-C3)",
        "bos": "fraction of the residual component removed by BOS replacement at early queries (C4)",
        "sinks": "sink heads, sink rate by data condition, sink-reading heads and their ablation",
        "fingerprint": "the position-0 fingerprint per layer, with and without BOS (C5)",
        "probe": "ridge probes from the residual stream to log(position + 1), per layer",
        "bands": "the residual component split by RoPE frequency band (exact) and R' attributed by band",
        "leakage": "positional leakage ΔR² per head (the measure of 'Once upon a token'), corrected test over seeds",
    }
    from lens_position.pipeline.steps import command_options

    for name, text in helps.items():
        sub = subs.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        _add_common(sub, many_models=False, out=Path(f"results-{name}"), analysis_options=command_options(name),
                    command=name)
        sub.add_argument(
            "--browser-check",
            dest="browser_check",
            action="store_true",
            help="also open the report in headless Chromium and save a screenshot",
        )
    from lens_position.cli.zoo import add_parser as add_zoo_parser

    add_zoo_parser(subs)

    sweep = subs.add_parser(
        "sweep", help="run models x data sources x BOS policies x seeds x steps from a TOML spec",
        description="Run the cross product a TOML spec names (models, sources, bos, seeds, steps; optional "
                    "text, quick, T, N) on either executor; write one table per step table with a column per "
                    "factor (source, bos, seed), the claims per condition, a report per condition and the "
                    "sweep's report.html.")
    sweep.add_argument("spec", type=path_option, metavar="SPEC.toml", help="the sweep spec (TOML)")
    out = sweep.add_argument_group("run")
    out.add_argument("--out", type=_out_folder, default=Path("sweep"), metavar="DIR",
                     help="output folder (default: %(default)s); finished steps cached in DIR/cache are reused")
    out.add_argument("--force", action="store_true",
                     help="write into a non-empty folder that holds no earlier run (its files are kept)")
    out.add_argument("--json", dest="json", action="store_true",
                     help="print what was written (files, claims) as one JSON object instead of a summary")
    out.add_argument("--format", dest="fmt", choices=("parquet", "csv"), default="parquet",
                     help="table format (default: %(default)s)")
    out.add_argument("--no-cache", dest="use_cache", action="store_false",
                     help="recompute every step even if a cached result exists")
    out.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    out.add_argument("--browser-check", dest="browser_check", action="store_true",
                     help="also open each condition's report in headless Chromium")
    _add_compute(sweep)
    for sub in subs.choices.values():  # also after the sub-command, where users put it
        sub.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                         help="show the full traceback of an error")
    return parser


def preflight(args: argparse.Namespace) -> None:
    """Refuse, before anything heavy is imported, a run that a step would refuse after minutes of
    work: an unknown model name, BOS-dependent steps under ``--bos none``, a ``--N`` below what a
    step can measure on. (``--layers`` and ``--T`` are checked next, against each model's config:
    :func:`lens_position.pipeline.models.check_shapes`.)"""
    from lens_position.pipeline.steps import commands, get_step

    if args.command not in commands():  # a sweep checks its own spec
        return
    from lens_position.pipeline.models import check_models

    # the model names, before anything is loaded (the zoo's shorthand is expanded with the run)
    requests = ([m.strip() for m in args.models.split(",") if m.strip()] if args.command == "reproduce"
                else [args.model])
    named = [r for r in requests if r != "zoo"]
    if named or not requests:
        check_models(named)
    steps = commands()[args.command]
    if args.bos == "none":
        needing = [get_step(name).needs_bos for name in steps if get_step(name).needs_bos]
        if needing:
            raise BadInputError(f"{needing[0]} needs BOS at position 0, which --bos none removes; use --bos force "
                                f"(the default) or run a command without that step")
    for name in steps:
        least = get_step(name).min_N
        if least is not None and args.N is not None and args.N < least[0]:
            raise BadInputError(f"--N {args.N} is too few for the {name} step: {least[1]}, at least {least[0]} "
                                f"sequences; use --N {least[0]} or more")


def _config(args: argparse.Namespace, argv: Sequence[str]):
    from lens_position.pipeline.config import Compute, DataOptions, RunConfig
    from lens_position.pipeline.steps import commands

    compute = Compute(device=args.device, dtype=args.dtype, n_devices=args.n_devices, threads=args.threads,
                      backend=args.backend)
    command = " ".join(["lens-position", *map(shlex.quote, argv)])
    if args.command == "sweep":
        from lens_position.pipeline.sweep import read_spec, sweep_config

        return sweep_config(read_spec(args.spec), out=args.out, compute=compute, executor=args.executor,
                            ray_address=args.ray_address, fmt=args.fmt, use_cache=args.use_cache,
                            browser_check=args.browser_check, progress=args.progress, command=command,
                            force=args.force)
    if args.command == "reproduce":
        from lens_position.pipeline.config import QUICK_ZOO_SEEDS
        from lens_position.pipeline.models import expand_zoo

        models = expand_zoo([m.strip() for m in args.models.split(",") if m.strip()], backend=args.backend,
                            seeds=QUICK_ZOO_SEEDS if args.quick else None)
    else:
        models = (args.model,)
    steps = commands()[args.command]
    if args.prompt_sets:
        if args.command not in ("reproduce", "decompose"):
            raise BadInputError(f"--prompt-sets measures C1's and C2's numbers, which {args.command} does not: "
                                "use it with reproduce or decompose")
        steps = steps + ("prompt_sets",)
    return RunConfig(
        out=args.out, models=models, steps=steps, prompt_sets=args.prompt_sets,
        layers=args.layers, query_range=args.query_range, keys=args.keys, batch_size=args.batch_size,
        lengths=args.lengths,
        data=DataOptions(source=args.source, corpus=args.corpus, bos=args.bos, seed=args.seed),
        T=args.T, N=args.N, quick=args.quick, fmt=args.fmt, use_cache=args.use_cache,
        browser_check=args.browser_check, progress=args.progress,
        compute=compute, executor=args.executor, ray_address=args.ray_address, command=command,
        force=args.force,
    )


def _summary(result) -> str:
    """What the command prints at the end: the files, what the run found
    (:meth:`lens_position.findings.Findings.summary_lines`), the steps that did not apply, the
    claims' verdicts and where the report is."""
    from lens_position.findings import verdict_lines
    from lens_position.report import takeaways

    lines = [f"wrote {len(result.files)} files to {result.files['report'].parent}"]
    banner = takeaways.small_run_banner(result.provenance)
    if banner:
        lines.insert(0, banner)
    if result.findings is not None:  # a sweep's tables hold many conditions per model: its numbers are in the tables
        lines += result.findings.summary_lines()
    # a step that does not apply to a model (rotary bands on NoPE, convergence without MLPs) says so,
    # one line per reason: the steps and the models it applies to
    skipped: dict[str, tuple[list[str], list[str]]] = {}
    for record in result.steps:
        why = record.provenance.get("skipped") if isinstance(record.provenance, dict) else None
        if why:
            steps, models = skipped.setdefault(str(why).replace(record.model, "the model"), ([], []))
            steps.extend([record.step] if record.step not in steps else [])
            models.extend([record.model] if record.model not in models else [])
    lines += [f"  {', '.join(steps)} skipped on {', '.join(models)}: {why}" for why, (steps, models) in skipped.items()]
    lines += verdict_lines(result.claims)
    lines.append(f"report: {result.files['report']}")
    return "\n".join(lines)


def _json_summary(command: str, result) -> str:
    """The files a run wrote and its claims, as one JSON object (for scripts)."""
    claims = json.loads(result.claims.to_json(orient="records")) if len(result.claims) else []
    return json.dumps({"command": command, "out": str(result.files["report"].parent),
                       "files": {name: str(path) for name, path in result.files.items()},
                       "claims": claims})


def _one_line(error: BaseException) -> str:
    return command_line_wording(" ".join(str(error).split()))


# The library's errors name Python arguments; on the command line they name its options.
_PYTHON_TO_COMMAND_LINE = (
    (re.compile(r"(?:lens_position\.)?load_model\(\.\.\., backend='(\w+)'(?:, [^)]*)?\)"), r"--backend \1"),
    (re.compile(r"backend='(\w+)'"), r"--backend \1"),
    (re.compile(r"\bn_devices\b"), "--n-devices"),
    (re.compile(r"the context of (\S+) \(n_ctx = (\d+)\); use T <= \d+, or load the model with "
                r"load_model\(\.\.\., n_ctx=(\d+)\) to extend it"),
     r"the context of \1 (n_ctx = \2); use --T \2 or less, or extend the context by naming the model as "
     r"\1@n_ctx=\3"),
    # the command line downloads nothing: a hub model is read from a folder downloaded beforehand
    (re.compile(r"(a hub id \(org/name\)) with offline=False"),
     r"\1 downloaded first (for instance with `huggingface-cli download org/name --local-dir FOLDER`) and passed as "
     "that folder: the command line reads local files only"),
)


def command_line_wording(text: str) -> str:
    """``text`` with the Python arguments it names as the command line's options
    (``load_model(..., backend='bridge')`` and ``backend='bridge'`` become ``--backend bridge``)."""
    for pattern, replacement in _PYTHON_TO_COMMAND_LINE:
        text = pattern.sub(replacement, text)
    return text


@contextlib.contextmanager
def _other_progress_bars_off(off: bool) -> Iterator[None]:
    """With ``off`` (--no-progress), the bars other libraries draw go too while the command runs
    (transformers dequantising a GGUF file or loading weights, the Hugging Face hub's, and tqdm's
    in processes started meanwhile); every switch is put back afterwards."""
    if not off:
        yield
        return
    saved = os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"
    try:
        from huggingface_hub import utils as hub_utils
        from transformers.utils import logging as transformers_logging
    except ImportError:  # neither is needed before a model loads; that load says what is missing
        hub_utils = transformers_logging = None  # type: ignore[assignment]
    restore = []
    if transformers_logging is not None:
        if transformers_logging.is_progress_bar_enabled():
            restore.append(transformers_logging.enable_progress_bar)
        transformers_logging.disable_progress_bar()
        if not hub_utils.are_progress_bars_disabled():
            restore.append(hub_utils.enable_progress_bars)
        hub_utils.disable_progress_bars()
        try:  # transformers' GGUF reader draws its bar with tqdm itself, not through its logging switch
            from transformers import modeling_gguf_pytorch_utils as gguf_reader
        except ImportError:
            gguf_reader = None
        if gguf_reader is not None and hasattr(gguf_reader, "tqdm"):
            own_tqdm = gguf_reader.tqdm
            gguf_reader.tqdm = functools.partial(own_tqdm, disable=True)
            restore.append(lambda: setattr(gguf_reader, "tqdm", own_tqdm))
    try:
        yield
    finally:
        for undo in restore:
            undo()
        if saved is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = saved


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``lens-position``; returns the exit status."""
    started = time.perf_counter()  # the report's wall time is the command's
    parser = build_parser()
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.basicConfig(level=logging.WARNING, format="lens-position: %(levelname)s: %(message)s")
    with _other_progress_bars_off(not getattr(args, "progress", True)):
        return _main(args, argv, started)


def _main(args: argparse.Namespace, argv: Sequence[str] | None, started: float) -> int:
    try:
        if args.command == "zoo":
            from lens_position.cli.zoo import run as run_zoo

            print(run_zoo(args))
            return 0
        preflight(args)  # before the imports of the run: an argument it refuses is refused in seconds
        config = _config(args, sys.argv[1:] if argv is None else argv)
        if args.command != "sweep":  # then each model's config, before any weight is read
            from lens_position.pipeline.models import check_shapes

            check_shapes(config.models, layers=args.layers, T=args.T)
        from lens_position.pipeline.runner import run

        result = run(config, started=started)
    except (LensPositionError, OSError) as error:
        if args.debug:
            raise
        if isinstance(error, OSError) and not isinstance(error, LensPositionError):
            into = f" into --out {args.out}" if getattr(args, "out", None) else ""  # the folder the run writes
            error = resource_error(error, doing=f"running `{args.command}`{into}")  # no raw [Errno ...] text
        if not getattr(error, "all_input_errors", True):  # a failed step hit a bug, not bad input
            print(f"lens-position: internal error: {_one_line(error)} (rerun with --debug for the traceback "
                  "and please report it)", file=sys.stderr)
            return EXIT_INTERNAL
        print(f"lens-position: error: {_one_line(error)}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("lens-position: interrupted; run the same command again to resume from the finished steps",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as error:  # a bug, not bad input: one line, the traceback only with --debug
        if args.debug:
            raise
        if is_input_error(error):  # out of memory: the run asked for more than this machine has
            print(f"lens-position: error: out of memory ({type(error).__name__}: {_one_line(error)}); lower --N, "
                  "--T or --batch-size", file=sys.stderr)
            return EXIT_ERROR
        print(f"lens-position: internal error: {type(error).__name__}: {_one_line(error)} "
              "(rerun with --debug for the traceback and please report it)", file=sys.stderr)
        return EXIT_INTERNAL
    print(_json_summary(args.command, result) if args.json else _summary(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
