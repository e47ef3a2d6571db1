"""The reproduction pipeline: claims C1-C5 on several architectures, cached step by step.

A run is a list of models and a list of steps. For each model: load it, then run each
step (an experiment from ``decompose`` / ``probes`` / ``bos`` / ``sinks`` / ``fingerprint``)
and keep its tidy tables. Every step's result is stored under ``<out>/cache/`` keyed by a
hash of the step's full configuration: the step name, the model's ``ModelSpec`` (weights
hash included), the data options and the prompt spec, the experiment options and the
lens_position version. Asking for the same step again reads it back, so an interrupted
run resumes where it stopped, and changing any option reruns only what it affects.

At the end the tables are stacked over models (columns ``architecture``, ``role`` and
``model`` in front), written as Parquet or CSV, the claims table and the provenance JSON
(models, weight hashes, data options, seed, package versions, wall time and peak memory
per step) are written next to them, and ``report.html`` is built and checked in headless
Chromium (screenshot ``report.png``).
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import logging
import os
import resource
import shutil
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import pandas as pd
from tqdm.auto import tqdm

import lens_position
from lens_position import provenance as provenance_module
from lens_position import report as report_module
from lens_position.errors import BadInputError, ContextLengthError, LensPositionError, MissingPackageError

log = logging.getLogger(__name__)

DEFAULT_MODELS: tuple[str, ...] = ("smollm2-135m", "smollm2-135m-ntk", "smollm2-135m-ntk-parts", "gemma3-270m")

# The experiment each step runs and the tables it produces (names as in report.TABLES).
STEP_TABLES: dict[str, tuple[str, ...]] = {
    "decompose": ("decompose_layers", "decompose_heads"),
    "probe": ("probe_layers",),
    "bos": ("bos_layers", "bos_overall"),
    "sink_heads": ("sink_heads",),
    "sink_rate": ("sink_rate",),
    "sink_reading": ("sink_reading", "sink_ablation"),
    "fingerprint": ("fingerprint",),
}
STEPS: tuple[str, ...] = tuple(STEP_TABLES)
# Sub-commands of the command line and the steps each runs.
COMMAND_STEPS: dict[str, tuple[str, ...]] = {
    "reproduce": STEPS,
    "decompose": ("decompose",),
    "probe": ("probe",),
    "bos": ("bos",),
    "sinks": ("sink_heads", "sink_rate", "sink_reading"),
    "fingerprint": ("fingerprint",),
}


@dataclass(frozen=True)
class Settings:
    """Sizes of a run. ``T`` counts every position including position 0; ``N`` is the
    number of sequences.

    - decompose: ``N`` sequences of ``T`` positions; models with sliding-window layers use
      ``max(T, ceil(window_factor · window))`` so that their local layers slide;
    - probe: the same ``T``, and enough sequences for ``probe_positions`` positions in all
      (at least ``N``): a ridge probe on a d_model-wide residual stream needs more samples
      than features on each side of its train/test split;
    - bos, sink_reading (measured at early queries ``query_range``): ``early_N`` sequences
      of ``query_range[1]`` positions. Under causal attention a query ``i`` sees keys
      ``<= i`` only, so longer sequences would not change what is measured, only its cost;
    - sink_heads, sink_rate, fingerprint: ``N`` sequences of ``sink_T`` positions (Gu et
      al.'s T = 64 set-up).
    """

    T: int
    N: int
    early_N: int
    probe_positions: int = 2048
    query_range: tuple[int, int] = (0, 32)
    eps: float = 0.3
    sink_T: int = 64
    window_factor: float = 1.25
    # Per-batch costs of the analysis hooks dominate small batches: on SmolLM2 at T = 32,
    # batches of 16 took 2.6x less CPU time than batches of 4.
    batch_size: int = 16


# The full run is sized to fit 15 min warm on 2 cores with peak memory under 8 GB: measured by
# benchmarks/reproduce.py on an idle 2-core machine, 298 s and 3.7 GB peak (the slowest steps:
# Gemma-3's decomposition and probe at T = 640, about 50 s each). --quick is a smoke run on tiny models.
FULL = Settings(T=128, N=16, early_N=16, probe_positions=2048, sink_T=64)
QUICK = Settings(T=40, N=4, early_N=4, probe_positions=160, query_range=(0, 16), sink_T=32)


@dataclass(frozen=True)
class DataOptions:
    """Which prompts every step is run on (see ``lens_position.data.build_prompts``)."""

    source: str = "natural"
    corpus: str | None = None
    bos: str = "force"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.source not in ("natural", "random", "repeated"):
            raise BadInputError(f"unknown data source {self.source!r}; use natural, random or repeated")
        if self.bos not in ("tokenizer", "force", "none") and not (
                self.bos.startswith("token:") and len(self.bos) > len("token:")):
            raise BadInputError(f"unknown BOS policy {self.bos!r}; use tokenizer, force, none or "
                                "token:<id or text>")
        if self.corpus is not None and not self.corpus.startswith("hf:") and not Path(self.corpus).exists():
            raise BadInputError(f"text source {self.corpus} does not exist; pass a text file, a folder "
                                "or hf:<name>:<split>[:<column>]")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class RunConfig:
    """Everything a run depends on. ``T`` / ``N`` of None take the mode's defaults."""

    out: Path
    models: tuple[str, ...] = DEFAULT_MODELS
    steps: tuple[str, ...] = STEPS
    data: DataOptions = field(default_factory=DataOptions)
    T: int | None = None
    N: int | None = None
    quick: bool = False
    fmt: str = "parquet"
    use_cache: bool = True
    browser_check: bool = True
    progress: bool = True
    command: str | None = None  # the command line that started the run, for the provenance

    def settings(self) -> Settings:
        base = QUICK if self.quick else FULL
        changes = {}
        if self.T is not None:
            changes.update(T=self.T, sink_T=self.T)
        if self.N is not None:
            changes.update(N=self.N, early_N=self.N, probe_positions=1)  # the user's N everywhere
        return dataclasses.replace(base, **changes)


@dataclass
class StepRecord:
    """One step of one model: where its result lives, whether it came from the cache, its cost."""

    step: str
    model: str
    key: str
    cached: bool
    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    provenance: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class RunResult:
    """The tables of a run (stacked over models), its claims table, provenance and files."""

    tables: dict[str, pd.DataFrame]
    claims: pd.DataFrame
    provenance: dict[str, Any]
    files: dict[str, Path]
    steps: list[StepRecord]


# --------------------------------------------------------------------------- measuring


def _rss_mb() -> float:
    """Resident memory of this process in MB (from /proc where available)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@contextmanager
def measure(interval_s: float = 0.05) -> Iterator[dict[str, float]]:
    """Wall time (s), CPU time (s, all threads of this process) and peak resident memory (MB)
    of the enclosed block. On a shared machine the CPU time is the steadier measure of cost:
    wall time grows with other processes' load, CPU time much less.

    A background thread samples the resident set every ``interval_s``; the process-wide
    ``ru_maxrss`` bounds it from above where the block set a new process peak.
    """
    stats: dict[str, float] = {}
    peak = [_rss_mb()]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(interval_s):
            peak[0] = max(peak[0], _rss_mb())

    thread = threading.Thread(target=sample, daemon=True)
    before_max = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    cpu_start = time.process_time()
    thread.start()
    try:
        yield stats
    finally:
        stop.set()
        thread.join()
        stats["wall_s"] = time.perf_counter() - start
        stats["cpu_s"] = time.process_time() - cpu_start
        after_max = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak_mb = max(peak[0], _rss_mb())
        if after_max > before_max:  # a new process peak was reached inside the block
            peak_mb = max(peak_mb, after_max / 1024)
        stats["peak_rss_mb"] = peak_mb


# --------------------------------------------------------------------------- the cache


def _jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _jsonable(dataclasses.asdict(obj))
    if hasattr(obj, "to_dict"):
        return _jsonable(obj.to_dict())
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, float) and obj != obj:
        return None
    if hasattr(obj, "item") and callable(obj.item):  # numpy / torch scalars
        return obj.item()
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    return repr(obj)


# ModelSpec.extra entries that describe one load (how long it took, whether the weight cache was
# warm), not the model: they must not change a cache key.
_LOAD_EVENT_KEYS = ("from_cache", "load_seconds", "cache_dir", "cache_path")


def _model_identity(model_spec: Any) -> dict[str, Any]:
    spec = _jsonable(model_spec)
    if isinstance(spec, dict) and isinstance(spec.get("extra"), dict):
        spec = {**spec, "extra": {k: v for k, v in spec["extra"].items() if k not in _LOAD_EVENT_KEYS}}
    return spec


def step_key(step: str, model_spec: Any, config: Mapping[str, Any]) -> str:
    """sha256 of the step's full configuration: step name, model spec (weights hash included;
    not how the load went), data and experiment options, and the lens_position version."""
    payload = {"step": step, "model": _model_identity(model_spec), "config": _jsonable(config),
               "lens_position": lens_position.__version__}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


class StepCache:
    """Step results on disk: ``<root>/<step>/<model>-<key[:20]>/`` holding one Parquet file per
    table and ``provenance.json``. A folder is written under a temporary name and renamed
    when complete, so an interrupted write never leaves a result that looks finished."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def path(self, step: str, model: str, key: str) -> Path:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model)[:60]
        return self.root / step / f"{safe}-{key[:20]}"

    def load(self, step: str, model: str, key: str) -> tuple[dict[str, pd.DataFrame], dict] | None:
        folder = self.path(step, model, key)
        meta = folder / "provenance.json"
        if not meta.is_file():
            return None
        try:
            record = json.loads(meta.read_text())
            if record.get("key") != key:
                return None
            tables = {name: pd.read_parquet(folder / f"{name}.parquet") for name in record["tables"]}
        except (OSError, ValueError, KeyError) as error:
            log.warning("ignoring unreadable cached result %s (%s); recomputing", folder, error)
            return None
        return tables, record["provenance"]

    def store(self, step: str, model: str, key: str, tables: Mapping[str, pd.DataFrame],
              provenance: Mapping[str, Any]) -> Path:
        folder = self.path(step, model, key)
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
        try:
            for name, frame in tables.items():
                frame.to_parquet(tmp / f"{name}.parquet", index=False)
            record = {"key": key, "step": step, "model": model, "tables": list(tables),
                      "provenance": _jsonable(provenance)}
            (tmp / "provenance.json").write_text(json.dumps(record, indent=1))
            if folder.exists():
                shutil.rmtree(folder)
            tmp.rename(folder)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return folder


# --------------------------------------------------------------------------- the steps


@dataclass
class StepContext:
    """What a step sees: the loaded model, the run's data options and sizes, and a lazily
    built prompt set (most steps share it)."""

    loaded: Any
    data: DataOptions
    settings: Settings
    progress: bool
    _prompts: dict[tuple, Any] = field(default_factory=dict)

    @property
    def spec(self) -> Any:
        return self.loaded.spec

    def model_T(self) -> int:
        """T for this model: raised to ``window_factor · window`` when it has sliding-window layers."""
        T = self.settings.T
        window = self.spec.window
        if window and "local" in tuple(self.spec.attn_types or ()):
            T = max(T, int(-(-self.settings.window_factor * window // 1)))
        return T

    def sizes(self, step: str) -> dict[str, Any]:
        """The sizes ``step`` runs with on this model (see ``Settings``)."""
        s = self.settings
        T_model = self.model_T()
        early_T = min(s.query_range[1], T_model)
        common = {"batch_size": s.batch_size}
        if step == "decompose":
            return {"T": T_model, "N": s.N, **common}
        if step == "probe":
            return {"T": T_model, "N": max(s.N, -(-s.probe_positions // T_model)), **common}
        if step in ("bos", "sink_reading"):
            return {"T": early_T, "N": s.early_N, "query_range": (s.query_range[0], early_T), **common}
        if step == "sink_heads":
            return {"T": min(s.sink_T, T_model), "N": s.N, "eps": s.eps, **common}
        if step == "sink_rate":
            return {"T": s.sink_T, "N": s.N, "eps": s.eps, **common}
        if step == "fingerprint":
            return {"T": s.sink_T, "N": s.N}
        raise BadInputError(f"unknown step {step!r}; choose from {', '.join(STEPS)}")

    def prompts(self, T: int, N: int) -> Any:
        from lens_position.data import build_prompts

        check_context(self.spec, T)
        key = (T, N)
        if key not in self._prompts:
            self._prompts[key] = build_prompts(self.loaded, source=self.data.source, T=T, N=N,
                                               bos=self.data.bos, seed=self.data.seed, corpus=self.data.corpus)
        return self._prompts[key]


def check_context(spec: Any, T: int) -> None:
    """ContextLengthError when ``T`` positions do not fit the model's context."""
    if T > spec.n_ctx:
        raise ContextLengthError(
            f"T = {T} exceeds the context of {spec.name} ({spec.n_ctx} positions); pass a smaller --T"
        )
    if T < 2:
        raise BadInputError(f"T = {T} is too short: the analyses need at least 2 positions")


def _frames(result: Any, names: Sequence[str], attrs: Sequence[str]) -> dict[str, pd.DataFrame]:
    return {name: getattr(result, attr).reset_index(drop=True) for name, attr in zip(names, attrs)}


def _need_bos(ctx: StepContext, prompts: Any, what: str) -> None:
    if not prompts.has_bos:
        raise BadInputError(f"{what} needs BOS at position 0, but the prompts of {ctx.spec.name} have none "
                            f"under --bos {ctx.data.bos}; use --bos force")


def _step_decompose(ctx: StepContext) -> tuple[dict[str, pd.DataFrame], dict, dict]:
    from lens_position.decompose import decompose

    sizes = ctx.sizes("decompose")
    prompts = ctx.prompts(sizes["T"], sizes["N"])
    result = decompose(ctx.loaded, prompts, batch_size=sizes["batch_size"], progress=ctx.progress)
    return (_frames(result, ("decompose_layers", "decompose_heads"), ("layers", "heads")),
            result.provenance, {"prompts": prompts.spec, **sizes})


def _step_probe(ctx: StepContext) -> tuple[dict[str, pd.DataFrame], dict, dict]:
    from lens_position.probes import position_probe

    sizes = ctx.sizes("probe")
    prompts = ctx.prompts(sizes["T"], sizes["N"])
    result = position_probe(ctx.loaded, prompts, seed=ctx.data.seed, batch_size=sizes["batch_size"],
                            progress=ctx.progress)
    return {"probe_layers": result.layers.reset_index(drop=True)}, result.provenance, {
        "prompts": prompts.spec, **sizes}


def _step_bos(ctx: StepContext) -> tuple[dict[str, pd.DataFrame], dict, dict]:
    from lens_position.bos import bos_replacement

    sizes = ctx.sizes("bos")
    prompts = ctx.prompts(sizes["T"], sizes["N"])
    _need_bos(ctx, prompts, "BOS replacement")
    result = bos_replacement(ctx.loaded, prompts, query_range=sizes["query_range"], seed=ctx.data.seed,
                             batch_size=sizes["batch_size"], progress=ctx.progress)
    return (_frames(result, ("bos_layers", "bos_overall"), ("frame", "overall")), result.provenance,
            {"prompts": prompts.spec, **sizes})


def _step_sink_heads(ctx: StepContext) -> tuple[dict[str, pd.DataFrame], dict, dict]:
    from lens_position.sinks import sink_heads

    sizes = ctx.sizes("sink_heads")
    prompts = ctx.prompts(sizes["T"], sizes["N"])
    result = sink_heads(ctx.loaded, prompts, eps=sizes["eps"], batch_size=sizes["batch_size"],
                        progress=ctx.progress)
    return {"sink_heads": result.frame.reset_index(drop=True)}, result.provenance, {
        "prompts": prompts.spec, **sizes}


def _step_sink_rate(ctx: StepContext) -> tuple[dict[str, pd.DataFrame], dict, dict]:
    from lens_position.sinks import sink_rate

    sizes = ctx.sizes("sink_rate")
    check_context(ctx.spec, sizes["T"])
    result = sink_rate(ctx.loaded, T=sizes["T"], N=sizes["N"], eps=sizes["eps"], seed=ctx.data.seed,
                       bos=ctx.data.bos, batch_size=sizes["batch_size"], progress=ctx.progress)
    return {"sink_rate": result.frame.reset_index(drop=True)}, result.provenance, sizes


def _step_sink_reading(ctx: StepContext) -> tuple[dict[str, pd.DataFrame], dict, dict]:
    from lens_position.sinks import sink_reading_heads

    sizes = ctx.sizes("sink_reading")
    prompts = ctx.prompts(sizes["T"], sizes["N"])
    _need_bos(ctx, prompts, "finding sink-reading heads (position 0 with and without BOS)")
    result = sink_reading_heads(ctx.loaded, prompts, counterfactual="no-bos", query_range=sizes["query_range"],
                                batch_size=sizes["batch_size"], progress=ctx.progress)
    return (_frames(result, ("sink_reading", "sink_ablation"), ("frame", "ablation")), result.provenance,
            {"prompts": prompts.spec, **sizes})


def _step_fingerprint(ctx: StepContext) -> tuple[dict[str, pd.DataFrame], dict, dict]:
    from lens_position.fingerprint import fingerprint

    sizes = ctx.sizes("fingerprint")
    check_context(ctx.spec, sizes["T"])
    result = fingerprint(ctx.loaded, T=sizes["T"], N=sizes["N"], seed=ctx.data.seed, source=ctx.data.source)
    return {"fingerprint": result.frame.reset_index(drop=True)}, result.provenance, sizes


STEP_FUNCTIONS: dict[str, Callable[[StepContext], tuple[dict[str, pd.DataFrame], dict, dict]]] = {
    "decompose": _step_decompose,
    "probe": _step_probe,
    "bos": _step_bos,
    "sink_heads": _step_sink_heads,
    "sink_rate": _step_sink_rate,
    "sink_reading": _step_sink_reading,
    "fingerprint": _step_fingerprint,
}


def step_config(step: str, ctx: StepContext) -> dict[str, Any]:
    """The configuration a step's cache key is computed from (besides the model spec): the
    data options and the sizes the step runs with, so changing one step's sizes reruns only it."""
    return {"data": ctx.data.to_dict(), "sizes": ctx.sizes(step)}


# --------------------------------------------------------------------------- the run


def architecture_label(spec: Any, request: str | None = None) -> tuple[str, str]:
    """(label, role) of a model: e.g. ("NTK-scaled RoPE: smollm2-135m-ntk", "ntk")."""
    role = report_module.role_of(spec)
    return f"{report_module.ROLE_NAMES[role]}: {request or spec.name}", role


def _tag(frame: pd.DataFrame, label: str, role: str, model: str) -> pd.DataFrame:
    frame = frame.copy()
    for col, value in (("model", model), ("role", role), ("architecture", label)):
        if col in frame.columns:
            frame = frame.drop(columns=col)
        frame.insert(0, col, value)
    return frame


# Load options a model request may carry after '@' (see parse_model_request) and their types.
_LOAD_OPTIONS: dict[str, type] = {"ntk_alpha": float, "ntk_by_parts": dict, "window": int, "n_ctx": int}


def parse_model_request(request: str) -> tuple[str, dict[str, Any]]:
    """Split ``"name@option=value@..."`` into the model name and ``load_model`` options.

    Options: ``ntk_alpha=<float>``, ``ntk_by_parts`` (Llama-3 defaults) or
    ``ntk_by_parts=<json object>``, ``window=<int>``, ``n_ctx=<int>``; e.g.
    ``tiny-llama@ntk_alpha=8`` or ``smollm2-135m@ntk_by_parts={"factor":4}``.
    """
    name, *parts = request.split("@")
    options: dict[str, Any] = {}
    for part in parts:
        key, _, value = part.partition("=")
        if key not in _LOAD_OPTIONS:
            raise BadInputError(f"unknown load option {key!r} in model {request!r}; use "
                                f"{', '.join(_LOAD_OPTIONS)}")
        kind = _LOAD_OPTIONS[key]
        try:
            if kind is dict:
                options[key] = json.loads(value) if value else {}
                if not isinstance(options[key], dict):
                    raise ValueError("not a JSON object")
            else:
                options[key] = kind(value)
        except ValueError as error:
            raise BadInputError(f"bad value {value!r} for {key} in model {request!r}: {error}") from None
    if not name:
        raise BadInputError(f"model request {request!r} has no model name")
    return name, options


def load_request(request: str) -> Any:
    """Load the model a request names (offline), with its '@' options."""
    from lens_position.models import load_model

    name, options = parse_model_request(request)
    return load_model(name, offline=True, **options)


def check_models(requests: Sequence[str]) -> None:
    """Fail fast on a request whose name is neither a registry model nor an existing path
    (UnknownModelError) or whose options are malformed (BadInputError)."""
    from lens_position.models.registry import lookup

    if not requests:
        raise BadInputError("no models given; pass --models with at least one name")
    if len(set(requests)) != len(requests):
        raise BadInputError(f"a model is listed twice in {', '.join(requests)}")
    for request in requests:
        name, _ = parse_model_request(request)
        if not Path(name).exists():
            lookup(name)


def prepare_output(out: Path) -> Path:
    """Create the output folder and check it is writable (BadInputError otherwise)."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".write-test-"):
            pass
    except OSError as error:
        raise BadInputError(f"cannot write to the output folder {out}: {error.strerror or error}; "
                            "choose another --out") from error
    return out


def write_table(frame: pd.DataFrame, path_stem: Path, fmt: str) -> Path:
    """Write ``frame`` as ``<stem>.parquet`` or ``<stem>.csv``."""
    if fmt == "parquet":
        path = path_stem.with_suffix(".parquet")
        frame.to_parquet(path, index=False)
    elif fmt == "csv":
        path = path_stem.with_suffix(".csv")
        frame.to_csv(path, index=False)
    else:
        raise BadInputError(f"unknown table format {fmt!r}; use parquet or csv")
    return path


def load_tables(out: Path) -> dict[str, pd.DataFrame]:
    """Read back the tables a run wrote to ``out`` (Parquet or CSV)."""
    tables = {}
    for name in report_module.TABLES:
        for suffix, reader in ((".parquet", pd.read_parquet), (".csv", pd.read_csv)):
            path = Path(out) / f"{name}{suffix}"
            if path.is_file():
                tables[name] = reader(path)
                break
    return tables


def run(config: RunConfig, *, load: Callable[[str], Any] | None = None) -> RunResult:
    """Run ``config.steps`` on every model in ``config.models`` and write the output folder.

    ``load`` maps a model name to a ``LoadedModel`` (default: ``lens_position.models.load_model``
    offline). Returns the stacked tables, the claims table, the provenance and the files written.
    """
    started = time.perf_counter()
    unknown = [s for s in config.steps if s not in STEP_FUNCTIONS]
    if unknown:
        raise BadInputError(f"unknown steps {unknown}; choose from {', '.join(STEPS)}")
    if config.fmt not in ("parquet", "csv"):
        raise BadInputError(f"unknown table format {config.fmt!r}; use parquet or csv")
    settings = config.settings()
    if settings.N < 2:
        raise BadInputError(f"N = {settings.N} is too small: held-out fits need at least 2 sequences")
    check_context_free(settings)
    if load is None:
        check_models(config.models)
        load = load_request

    out = prepare_output(config.out)
    cache = StepCache(out / "cache")
    collected: dict[str, list[pd.DataFrame]] = {}
    records: list[StepRecord] = []
    models_info: list[dict[str, Any]] = []
    total = len(config.models) * len(config.steps)
    bar = tqdm(total=total, desc="reproduce", unit="step", disable=not config.progress, file=sys.stderr)
    try:
        for name in config.models:
            bar.set_postfix_str(f"loading {name}")
            with measure() as cost:
                loaded = load(name)
            label, role = architecture_label(loaded.spec, name)
            models_info.append({**_jsonable(loaded.spec), "request": name, "architecture": label, "role": role,
                                "load_wall_s": round(cost["wall_s"], 3)})
            records.append(StepRecord("load", name, "", False, cost["wall_s"], cost["cpu_s"],
                                      cost["peak_rss_mb"], {"model": _jsonable(loaded.spec)}))
            ctx = StepContext(loaded=loaded, data=config.data, settings=settings, progress=config.progress)
            check_context(loaded.spec, ctx.model_T())
            for step in config.steps:
                bar.set_postfix_str(f"{name}: {step}")
                key = step_key(step, loaded.spec, step_config(step, ctx))
                hit = cache.load(step, name, key) if config.use_cache else None
                with measure() as cost:
                    if hit is not None:
                        tables, prov = hit
                    else:
                        tables, prov, extra = STEP_FUNCTIONS[step](ctx)
                if hit is None:
                    # The cost of computing the step travels with its cached result, so a
                    # resumed run still reports what every step cost.
                    prov = {**_jsonable(prov), "step_options": _jsonable(extra),
                            "computed_cost": {k: round(v, 3) for k, v in cost.items()}}
                    cache.store(step, name, key, tables, prov)
                records.append(StepRecord(step, name, key, hit is not None, cost["wall_s"], cost["cpu_s"],
                                          cost["peak_rss_mb"], prov))
                for table, frame in tables.items():
                    collected.setdefault(table, []).append(_tag(frame, label, role, name))
                bar.update(1)
            del ctx, loaded
            gc.collect()
    finally:
        bar.close()

    stacked = {name: pd.concat(frames, ignore_index=True) for name, frames in collected.items()}
    files: dict[str, Path] = {}
    for name, frame in stacked.items():
        files[name] = write_table(frame, out / name, config.fmt)
    claims = report_module.claims_table(stacked)
    files["claims"] = write_table(claims, out / "claims", "csv")
    prov = {
        "command": config.command,
        "steps_requested": list(config.steps),
        "models": models_info,
        "data": config.data.to_dict(),
        "settings": dataclasses.asdict(settings),
        "quick": config.quick,
        "seed": config.data.seed,
        "versions": provenance_module.package_versions(),
        "created": provenance_module.collect()["created"],
        "steps": [r.to_dict() for r in records],
    }
    files["report"] = out / "report.html"
    computed = [r.provenance.get("computed_cost", {}).get("wall_s") for r in records if r.step != "load"]
    prov["steps_reused"] = sum(r.cached for r in records)
    if computed and all(c is not None for c in computed):
        prov["steps_computed_wall_s"] = round(sum(computed), 3)  # as first computed, cached or not
    prov["wall_time_s"] = round(time.perf_counter() - started, 3)
    report_module.write_report(files["report"], stacked, provenance=prov)
    check = None
    if config.browser_check:
        check, prov["browser_check"] = _browser_check(files["report"], out / "report.png")
        if check is not None and check.screenshot is not None:
            files["screenshot"] = check.screenshot
    prov["wall_time_s"] = round(time.perf_counter() - started, 3)
    files["provenance"] = out / "provenance.json"
    files["provenance"].write_text(json.dumps(_jsonable(prov), indent=1))
    if check is not None and not check.ok:
        raise ReportCheckError(
            f"the report {files['report']} failed its browser check: {len(check.undrawn)} figure(s) not drawn "
            f"({', '.join(check.undrawn) or 'none'}), JavaScript errors: {check.js_errors or 'none'}")
    return RunResult(tables=stacked, claims=claims, provenance=prov, files=files, steps=records)


def check_context_free(settings: Settings) -> None:
    """Checks of the sizes that need no model."""
    if settings.T < 2:
        raise BadInputError(f"T = {settings.T} is too short: the analyses need at least 2 positions")
    lo, hi = settings.query_range
    if not 0 <= lo < hi:
        raise BadInputError(f"query range {settings.query_range} is empty")


def _browser_check(report: Path, screenshot: Path) -> tuple[Any, dict[str, Any]]:
    """Open the report in headless Chromium: (the check, its record for the provenance).
    Without Chromium the check is skipped with a warning, and the record says so."""
    try:
        check = report_module.check_in_browser(report, screenshot=screenshot)
    except MissingPackageError as error:
        log.warning("report not checked in a browser: %s", error)
        return None, {"ok": None, "skipped": str(error)}
    return check, check.to_dict()


class ReportCheckError(LensPositionError, RuntimeError):
    """The HTML report did not render cleanly in headless Chromium."""
