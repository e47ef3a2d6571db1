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

import logging
from typing import Any, Mapping

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


def start_local_ray(*, num_cpus: int | None = None, object_store_memory: int | None = None) -> Any:
    """Start a Ray instance on this machine whose workers import the same ``lens_position`` as
    this process (its folder goes first on their ``PYTHONPATH``). Returns ``ray``."""
    import os
    from pathlib import Path

    ray = import_ray()
    here = str(Path(__file__).resolve().parents[2])  # the folder holding the lens_position package
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    kwargs: dict[str, Any] = {"num_cpus": num_cpus, "include_dashboard": False, "logging_level": logging.WARNING,
                              "runtime_env": {"env_vars": {"PYTHONPATH": path}}}
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
