"""The Ray executor: an actor per model, the model's cells as tasks on it.

Each actor loads its model once (on a GPU when the run's device is ``cuda``: it asks Ray for
``n_devices`` GPUs) and runs that model's cells in turn; actors of different models run in
parallel, as many as the cluster's CPUs (or GPUs) allow. Every result comes back to the
driver, which alone checks and writes the step cache and the output folder, so a cluster
needs no shared disk (the driver also ships the corpus text). A worker that dies is
restarted and its unfinished cells rerun (``max_restarts``); a cell that raises is reported
with the cell and the other cells still finish. An interrupted run resumes from the
driver's step cache, like a serial run.

Install with ``pip install "lens_position[ray]"``. Without ``address`` a local Ray instance is
started for the run (``num_cpus``: its CPUs) and stopped after it; with ``address`` (e.g.
``ray://head:10001`` or ``auto``) the run joins a running cluster. If Ray is already
initialised in this process, that instance is used and left running.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

from lens_position.ground.errors import BadInputError, MissingPackageError
from lens_position.pipeline.plan import Cell, Plan
from lens_position.pipeline.steps import Step
from lens_position.pipeline.worker import CellResult, Loaded, ModelWorker

log = logging.getLogger(__name__)


def import_ray() -> Any:
    """The ``ray`` module (MissingPackageError naming the extra to install when it is absent)."""
    try:
        import ray
    except ImportError as error:
        raise MissingPackageError('--executor ray needs Ray: pip install "lens_position[ray]"') from error
    return ray


LOOPBACK = "127.0.0.1"
CONNECT_TIMEOUT_S = 5.0
RAY_CLIENT_PORT, RAY_GCS_PORT = 10001, 6379


def check_ray_address(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Refuse, within ``timeout_s``, a cluster address where nothing answers (``ray.init``
    would retry for minutes, and retry at this node's own address): ``host:port``,
    ``ray://host[:port]`` (a TCP connection must open), or ``auto`` (a cluster started on this
    machine must be recorded in ``/tmp/ray/ray_current_cluster``)."""
    import socket
    from pathlib import Path

    text = address.strip()
    if text == "auto":
        current = Path("/tmp/ray/ray_current_cluster")
        if not current.is_file() or not current.read_text().strip():
            raise BadInputError("--ray-address auto found no Ray cluster started on this machine (no "
                                f"{current}); start one with `ray start --head`, pass its address, or drop "
                                "--ray-address to run a local instance")
        text = current.read_text().strip().splitlines()[0]
    client = text.startswith("ray://")
    hostport = text.removeprefix("ray://").rstrip("/")
    host, _, port_text = hostport.rpartition(":") if ":" in hostport else (hostport, "", "")
    host = host.strip("[]") or hostport
    try:
        port = int(port_text) if port_text else (RAY_CLIENT_PORT if client else RAY_GCS_PORT)
    except ValueError:
        raise BadInputError(f"--ray-address {address!r} is not host:port, ray://host:port or auto") from None
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as error:
        raise BadInputError(f"no Ray cluster answers at {address!r} ({host}:{port}: {error.strerror or error}) "
                            f"within {timeout_s:g} s; check the address and that the cluster is up "
                            "(`ray status` on its head node), or drop --ray-address to run locally") from error


# Ray's head process asks the cloud metadata services (169.254.169.254, metadata.google.internal)
# which cloud it runs on whenever it starts, usage statistics on or off. While a local instance
# starts, plain-HTTP requests go to a proxy address on the loopback where nothing listens, so
# those requests fail at once without a packet leaving the machine (the host name is not even
# resolved); the workers get the caller's own proxy settings back.
PROXY_VARIABLES = ("http_proxy", "HTTP_PROXY", "no_proxy", "NO_PROXY")
CLOSED_LOOPBACK_PROXY = f"http://{LOOPBACK}:9"  # the discard port: nothing listens on it


@contextlib.contextmanager
def _head_processes_offline() -> Iterator[dict[str, str]]:
    """For the duration: HTTP through a closed loopback port, no proxy exceptions. Yields the
    caller's own values of those variables ("" where unset: no proxy), for the workers."""
    saved = {name: os.environ.get(name) for name in PROXY_VARIABLES}
    os.environ.update(http_proxy=CLOSED_LOOPBACK_PROXY, HTTP_PROXY=CLOSED_LOOPBACK_PROXY, no_proxy="", NO_PROXY="")
    try:
        yield {name: value or "" for name, value in saved.items()}
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def start_local_ray(*, num_cpus: int | None = None, object_store_memory: int | None = None) -> Any:
    """Start a Ray instance on this machine whose workers import the same ``lens_position`` as
    this process (its folder goes first on their ``PYTHONPATH``). Every Ray process binds the
    loopback address, and starting sends nothing off the machine (see ``PROXY_VARIABLES``).
    Returns ``ray``."""
    from pathlib import Path

    ray = import_ray()
    here = str(Path(__file__).resolve().parents[2])  # the folder holding the lens_position package
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    with _head_processes_offline() as own_proxies:
        kwargs: dict[str, Any] = {"num_cpus": num_cpus, "include_dashboard": False, "logging_level": logging.WARNING,
                                  "runtime_env": {"env_vars": {"PYTHONPATH": path, **own_proxies}},
                                  "_node_ip_address": LOOPBACK}
        if object_store_memory:
            kwargs["object_store_memory"] = object_store_memory
        ray.init(**kwargs)
    return ray


class ModelActor:
    """The body of a Ray actor: a ``ModelWorker`` in a worker process, its torch threads set to
    the CPUs Ray gave it (so parallel actors do not oversubscribe the cores)."""

    def __init__(self, request: str, steps: Mapping[str, Step], compute: Any):
        import ray
        import torch

        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
        threads = compute.threads or (max(1, int(cpus)) if cpus else None)
        if threads:
            torch.set_num_threads(threads)
        self.worker = ModelWorker(request, steps, compute=compute)

    def describe(self) -> Loaded:
        return self.worker.describe()

    def expect(self, cells: list[Cell]) -> None:
        self.worker.expect(cells)

    def run(self, cell: Cell) -> CellResult:
        return self.worker.run(cell)

    def pid(self) -> int:
        import os

        return os.getpid()


class RayExecutor:
    """Run a plan on Ray (see the module docstring). ``cpus_per_model``: CPUs each model's
    actor reserves; ``max_restarts``: how often a dead worker is restarted (its cells rerun)."""

    def __init__(self, *, address: str | None = None, num_cpus: int | None = None, cpus_per_model: float = 1,
                 max_restarts: int = 2, object_store_memory: int | None = None):
        self.address = address
        self.num_cpus = num_cpus
        self.cpus_per_model = cpus_per_model
        self.max_restarts = max_restarts
        self.object_store_memory = object_store_memory
        self.actors: dict[int, Any] = {}  # live actors by model index (tests kill one)

    def _init(self, ray: Any) -> bool:
        """Start or join Ray; True when this call started it (and so must stop it)."""
        if ray.is_initialized():
            return False
        if self.address:
            check_ray_address(self.address)
            ray.init(address=self.address, include_dashboard=False, logging_level=logging.WARNING)
        else:
            start_local_ray(num_cpus=self.num_cpus, object_store_memory=self.object_store_memory)
        return True

    def _gpus(self, ray: Any, compute: Any) -> float:
        if compute.device == "cuda":
            return float(compute.n_devices)
        if compute.device == "auto" and ray.cluster_resources().get("GPU", 0) > 0:
            return float(compute.n_devices)
        return 0.0

    def execute(self, plan: Plan, steps: Mapping[str, Step], driver: Any) -> None:
        ray = import_ray()
        started = self._init(ray)
        try:
            self._execute(ray, plan, steps, driver)
        finally:
            for actor in self.actors.values():
                ray.kill(actor)
            self.actors.clear()
            if started:
                ray.shutdown()

    def _execute(self, ray: Any, plan: Plan, steps: Mapping[str, Step], driver: Any) -> None:
        gpus = self._gpus(ray, plan.compute)
        if gpus and ray.cluster_resources().get("GPU", 0) < gpus:
            raise BadInputError(f"--device {plan.compute.device} asks {gpus:g} GPU(s) per model, but the Ray cluster "
                                f"has {ray.cluster_resources().get('GPU', 0):g}; use --device cpu or add GPU workers")
        actor_class = ray.remote(ModelActor).options(
            num_cpus=self.cpus_per_model, num_gpus=gpus, max_restarts=self.max_restarts,
            max_task_retries=self.max_restarts)
        # The registry travels by value with each actor's constructor (small: functions by reference),
        # so a restarted actor never depends on an object-store entry that may be gone.
        steps_value = dict(steps)
        waiting: dict[Any, tuple[str, int, Cell | None]] = {}
        remaining: dict[int, int] = {}
        for index, model in enumerate(plan.models):
            actor = actor_class.remote(model, steps_value, plan.compute)
            self.actors[index] = actor
            waiting[actor.describe.remote()] = ("describe", index, None)
        while waiting:
            done, _ = ray.wait(list(waiting), num_returns=1)
            kind, index, cell = waiting.pop(done[0])
            model = plan.models[index]
            try:
                value = ray.get(done[0])
            except Exception as error:  # noqa: BLE001 - reported with its cell below
                cause = _cause(ray, error)
                if kind == "describe":  # the model could not be loaded: nothing of it can run
                    raise cause from error
                driver.on_failure(cell, cause)
            else:
                if kind == "describe":
                    cells = driver.on_loaded(model, index, value)
                    remaining[index] = len(cells)
                    self.actors[index].expect.remote(cells)  # an actor runs its calls in order: before the cells
                    for c in cells:
                        waiting[self.actors[index].run.remote(c)] = ("run", index, c)
                else:
                    driver.on_result(cell, value)
            if kind == "run":
                remaining[index] -= 1
            if remaining.get(index) == 0 and index in self.actors:  # free its CPUs (or GPUs) for the next model
                ray.kill(self.actors.pop(index))


def _cause(ray: Any, error: BaseException) -> BaseException:
    """The exception a cell raised inside its worker (Ray wraps it in RayTaskError)."""
    if isinstance(error, ray.exceptions.RayTaskError):
        cause = getattr(error, "cause", None)
        if isinstance(cause, BaseException):
            return cause
    return error
