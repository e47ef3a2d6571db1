"""What a run is asked to do: the models, the data conditions, the sizes and where to write.

Nothing here loads a model or reads data; ``plan`` turns a ``RunConfig`` into cells.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lens_position.core.checks import check_seed
from lens_position.core.intervals import N_RESAMPLES
from lens_position.core.stream import BATCH_SIZE
from lens_position.ground.errors import BadInputError
from lens_position.ground.paths import checked_path
from lens_position.models.registry import DEFAULT_MODELS


@dataclass(frozen=True)
class Settings:
    """Sizes of a run. ``T`` counts every position including position 0; ``N`` is the
    number of sequences.

    - decompose: ``N`` sequences of ``T`` positions; models with sliding-window layers use
      ``max(T, ceil(window_factor · window))`` so that their local layers slide;
    - probe: the same ``T``, and enough sequences for ``probe_positions`` positions in all
      (at least ``N``): a ridge probe on a d_model-wide residual stream needs more samples
      than features on each side of its train/test split;
    - bos, sink_reading, convergence (measured at early queries ``query_range``): the first
      ``query_range[1]`` positions of ``early_N`` decomposition prompts. Under causal attention a
      query ``i`` sees keys ``<= i`` only, so longer sequences would not change what is measured,
      only its cost;
    - sink_heads (and the rotary bands): the first ``sink_T`` positions of the decomposition's
      prompts (Gu et al.'s T = 64 set-up; ``analyze`` reads the same positions);
    - sink_rate, fingerprint: ``N`` sequences of ``sink_T`` positions of their own conditions.

    ``n_resamples``: bootstrap replicates behind every interval (0: no intervals; see
    :mod:`lens_position.core.intervals`).

    ``lengths``, ``sweep_N``: the length sweep (step ``length_sweep``) decomposes ``sweep_N``
    sequences at every length of ``lengths`` and at ``T`` (those that fit the model's context):
    the claims compare architectures at a length both were measured at.

    ``prompt_sets``: ``K`` disjoint prompt sets of ``N`` sequences of ``T`` positions on which
    the opt-in step ``prompt_sets`` measures C1's and C2's numbers (0: the step is off; see
    :mod:`lens_position.analyses.prompt_sets`).
    """

    T: int
    N: int
    early_N: int
    probe_positions: int = 2048
    query_range: tuple[int, int] = (0, 32)
    eps: float = 0.3
    sink_T: int = 64
    window_factor: float = 1.25
    batch_size: int = BATCH_SIZE  # the Python analyses' default (core.stream)
    # Restrictions from the command line (--layers, --query-range, --keys): None / "all" analyse
    # the whole model. ``decompose_queries`` is the decomposition's query range (None: every query).
    layers: tuple[int, ...] | None = None
    decompose_queries: tuple[int, int] | None = None
    keys: str = "all"
    n_resamples: int = N_RESAMPLES
    prompt_sets: int = 0
    lengths: tuple[int, ...] = (32, 64, 128, 256, 512, 1024)  # twice Gemma-3's window at the top
    sweep_N: int = 8

    def check(self) -> None:
        """Checks of the sizes that need no model (BadInputError)."""
        if self.N < 2:
            raise BadInputError(f"N = {self.N} is too small: held-out fits need at least 2 sequences")
        if self.T < 2:
            raise BadInputError(f"T = {self.T} is too short: the analyses need at least 2 positions")
        lo, hi = self.query_range
        if not 0 <= lo < hi:
            raise BadInputError(f"query range {self.query_range} is empty")
        if self.layers is not None and (not self.layers or min(self.layers) < 0):
            raise BadInputError(f"layers {list(self.layers)}: give one or more layer indices >= 0")
        if self.keys not in ("all", "no-bos"):
            raise BadInputError(f"unknown key set {self.keys!r}; use all or no-bos")
        if self.batch_size < 1:
            raise BadInputError(f"batch size {self.batch_size} must be at least 1")
        if self.prompt_sets == 1 or self.prompt_sets < 0:
            raise BadInputError(f"{self.prompt_sets} prompt sets: the spread between prompt sets needs at least 2")


# The full run is sized to fit 15 min warm on 2 cores with peak memory under 8 GB (the slowest
# steps: Gemma-3's decomposition and probe at T = 640). --quick runs every step on every model at
# small sizes, with 50 bootstrap replicates instead of 200 (each interval's refits cost in
# proportion) and two zoo seeds: about 2.5 min of 2 cores with the weights cached, 3.3 min the first
# time (docs/performance.md).
FULL = Settings(T=128, N=16, early_N=16, probe_positions=2048, sink_T=64)
QUICK = Settings(T=40, N=4, early_N=4, probe_positions=160, query_range=(0, 16), sink_T=32, n_resamples=50,
                 lengths=(16, 80), sweep_N=4)
# --quick's `zoo` request: two seeds of each variant (a paired comparison needs two), not all three
QUICK_ZOO_SEEDS = (0, 1)


@dataclass(frozen=True)
class DataOptions:
    """Which prompts every step is run on (see ``lens_position.core.data.build_prompts``): one
    data condition of a run (a sweep runs several)."""

    source: str = "natural"
    corpus: str | None = None
    bos: str = "force"
    seed: int = 0

    def __post_init__(self) -> None:
        check_seed(self.seed)  # a sweep's seeds = [-1] would otherwise fail inside numpy
        if self.source not in ("natural", "random", "repeated"):
            raise BadInputError(f"unknown data source {self.source!r}; use natural, random or repeated")
        if self.bos not in ("tokenizer", "force", "none") and not (
                self.bos.startswith("token:") and len(self.bos) > len("token:")):
            raise BadInputError(f"unknown BOS policy {self.bos!r}; use tokenizer, force, none or "
                                "token:<id or text>")
        if self.corpus is not None and not (isinstance(self.corpus, str) and self.corpus.startswith("hf:")) \
                and not checked_path(self.corpus, "the text source (--text)").exists():
            raise BadInputError(f"text source {self.corpus} does not exist; pass a text file, a folder "
                                "or hf:<name>:<split>[:<column>]")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


MAX_THREADS_PER_CORE = 4  # beyond this, --threads is a typo (100000 ends in "can't start new thread")


@dataclass(frozen=True)
class Compute:
    """Where and in what precision models are loaded and run.

    ``device``: ``"cpu"``, ``"cuda"`` or ``"auto"`` (cuda when available); ``dtype``: the
    weights' and activations' precision (``float32``, ``bfloat16``, ``float16``); the
    decomposition's statistics are accumulated in float64 whatever the dtype.
    ``n_devices``: GPUs a model is split over (TransformerLens pipeline of layers).
    ``backend``: the model seam's backend (``auto``, ``hooked``, ``bridge``; see
    ``lens_position.models.backends``).
    ``threads``: torch's CPU threads per model (None: torch's default in this process, the
    actor's CPUs under Ray). Results are bitwise identical for the same thread count; another
    count changes float rounding only (about 1e-13 on the tiny models), so it is not part of
    a step's cache key.
    """

    device: str = "cpu"
    dtype: str = "float32"
    n_devices: int = 1
    threads: int | None = None
    backend: str = "auto"

    def __post_init__(self) -> None:
        if self.backend not in ("auto", "hooked", "bridge"):
            raise BadInputError(f"unknown backend {self.backend!r}; use auto, hooked or bridge")
        if self.device not in ("cpu", "cuda", "auto"):
            raise BadInputError(f"unknown device {self.device!r}; use cpu, cuda or auto")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise BadInputError(f"unknown dtype {self.dtype!r}; use float32, bfloat16 or float16")
        if not isinstance(self.n_devices, int) or self.n_devices < 1:
            raise BadInputError(f"n_devices must be a positive whole number, got {self.n_devices!r}")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            raise BadInputError(f"threads must be a positive whole number, got {self.threads!r}")
        if self.threads is not None and self.threads > MAX_THREADS_PER_CORE * (os.cpu_count() or 1):
            raise BadInputError(f"threads = {self.threads} on a machine with {os.cpu_count()} CPU cores: more torch "
                                "threads than cores only slows a run down (and the system refuses to start that "
                                f"many); use at most {os.cpu_count()}, or leave --threads out")
        if self.n_devices > 1 and self.device == "cpu":
            raise BadInputError(f"n_devices = {self.n_devices} splits a model over GPUs; use --device cuda")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def key_dict(self) -> dict[str, Any]:
        """What of the compute options a result depends on (its cache key)."""
        key: dict[str, Any] = {"device": self.device, "dtype": self.dtype, "n_devices": self.n_devices}
        from lens_position.models.backends import resolve_backend

        backend = resolve_backend(self.backend)
        if backend != "hooked":  # the reference backend keeps the keys results were cached under
            key["backend"] = backend
        return key


@dataclass
class RunConfig:
    """Everything a run depends on. ``T`` / ``N`` of None take the mode's defaults.

    ``conditions`` (a sweep's data conditions) defaults to the single condition ``data``.
    ``executor``: ``"serial"`` (one model after another in this process) or ``"ray"``
    (an actor per model, cells as tasks; ``ray_address`` joins a running cluster).
    """

    out: Path
    models: tuple[str, ...] = DEFAULT_MODELS
    steps: tuple[str, ...] | None = None  # None: every step of the registry
    data: DataOptions = field(default_factory=DataOptions)
    conditions: tuple[DataOptions, ...] | None = None
    factors: tuple[str, ...] = ()  # DataOptions fields that get a column in every table (a sweep's)
    T: int | None = None
    N: int | None = None
    quick: bool = False
    fmt: str = "parquet"
    use_cache: bool = True
    browser_check: bool = True
    progress: bool = True
    command: str | None = None  # the command line that started the run, for the provenance
    compute: Compute = field(default_factory=Compute)
    executor: str = "serial"
    ray_address: str | None = None
    ray_num_cpus: int | None = None  # CPUs of a local Ray instance (None: all of this machine's)
    # Analysis restrictions (None: the mode's defaults): layers analysed, the queries analysed
    # (the decomposition's, and the early queries of BOS replacement and sink reading), the key
    # set of the decomposition, sequences per forward pass.
    layers: tuple[int, ...] | None = None
    query_range: tuple[int, int] | None = None
    keys: str | None = None
    batch_size: int | None = None
    n_resamples: int | None = None  # bootstrap replicates (None: the mode's default; 0: no intervals)
    prompt_sets: int = 0  # K disjoint prompt sets for the opt-in step prompt_sets (0: off)
    lengths: tuple[int, ...] | None = None  # the length sweep's grid (None: the mode's default)
    force: bool = False  # write into a non-empty folder that holds no run (its files are kept)

    def __post_init__(self) -> None:
        if self.executor not in ("serial", "ray"):
            raise BadInputError(f"unknown executor {self.executor!r}; use serial or ray")
        if self.ray_address is not None:
            if not isinstance(self.ray_address, str) or not self.ray_address.strip():
                raise BadInputError(f"--ray-address {self.ray_address!r} names no cluster; pass host:port, "
                                    "ray://host:port or auto, or leave it out to start a local Ray instance")
            if self.executor != "ray":  # else it would be ignored, and the run would not be where the user thinks
                raise BadInputError(f"--ray-address {self.ray_address} joins a Ray cluster, which only the ray "
                                    "executor uses; add --executor ray (executor='ray'), or drop --ray-address")

    def settings(self) -> Settings:
        base = QUICK if self.quick else FULL
        changes: dict[str, Any] = {} if self.n_resamples is None else {"n_resamples": self.n_resamples}
        if self.prompt_sets:
            changes.update(prompt_sets=self.prompt_sets)
        if self.T is not None:
            changes.update(T=self.T, sink_T=self.T)
        if self.N is not None:
            changes.update(N=self.N, early_N=self.N, probe_positions=1, sweep_N=self.N)  # the user's N everywhere
        if self.layers is not None:
            changes.update(layers=tuple(self.layers))
        if self.query_range is not None:
            changes.update(query_range=tuple(self.query_range), decompose_queries=tuple(self.query_range))
        if self.keys is not None:
            changes.update(keys=self.keys)
        if self.batch_size is not None:
            changes.update(batch_size=self.batch_size)
        if self.lengths is not None:
            changes.update(lengths=tuple(self.lengths))
        return dataclasses.replace(base, **changes)

    def all_conditions(self) -> tuple[DataOptions, ...]:
        return tuple(self.conditions) if self.conditions else (self.data,)
