"""Executors: who runs a plan's cells. Each asks the driver (``Driver``) which cells of a
model still need computing once the model is loaded, runs them, and hands every result or
failure back to the driver, which alone touches the cache and the outputs.

``SerialExecutor`` (the default) runs one model after another in this process. The Ray
executor (``lens_position.pipeline.ray_executor``) runs an actor per model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from lens_position.ground.progress import progress
from lens_position.pipeline.plan import Cell, Plan
from lens_position.pipeline.steps import Step
from lens_position.pipeline.worker import CellResult, Loaded, ModelWorker


class Driver(Protocol):
    """What an executor reports to (implemented by ``lens_position.pipeline.runner``)."""

    def on_loaded(self, model: str, model_index: int, loaded: Loaded) -> list[Cell]:
        """A model is loaded: returns its cells that are not in the cache."""

    def on_result(self, cell: Cell, result: CellResult) -> None:
        """A cell was computed."""

    def on_failure(self, cell: Cell, error: BaseException) -> None:
        """A cell raised ``error``; the other cells go on."""


class SerialExecutor:
    """Models one after another in this process; a model is released before the next loads.
    With ``progress``, each computed cell shows one bar labelled with its model and step
    (``Plan.label``), counting the sequences of its forward passes; the analyses' own bars
    fold into it."""

    def __init__(self, *, load: Callable[[str], Any] | None = None, progress: bool = False):
        self.load = load
        self.progress = progress

    def execute(self, plan: Plan, steps: Mapping[str, Step], driver: Driver) -> None:
        import torch

        threads = torch.get_num_threads()
        if plan.compute.threads is not None:
            torch.set_num_threads(plan.compute.threads)
        try:
            self._execute(plan, steps, driver)
        finally:
            torch.set_num_threads(threads)

    def _execute(self, plan: Plan, steps: Mapping[str, Step], driver: Driver) -> None:
        for index, model in enumerate(plan.models):
            worker = ModelWorker(model, steps, compute=plan.compute, load=self.load, progress=self.progress)
            try:
                cells = driver.on_loaded(model, index, worker.describe())
                worker.expect(cells)
                for cell in cells:
                    try:
                        with progress(plan.label(cell), enabled=self.progress, leave=False):
                            result = worker.run(cell)
                    except Exception as error:  # reported with its cell; the rest still run
                        driver.on_failure(cell, error)
                        continue
                    driver.on_result(cell, result)
            finally:
                worker.close()


def make_executor(name: str, *, load: Callable[[str], Any] | None = None, progress: bool = False,
                  ray_address: str | None = None, ray_num_cpus: int | None = None,
                  ray_object_store: int | None = None) -> Any:
    """The executor called ``name`` (``"serial"`` or ``"ray"``)."""
    if name == "ray":
        from lens_position.pipeline.ray_executor import RayExecutor

        if load is not None:
            raise ValueError("a custom load function runs in this process only; use the serial executor")
        return RayExecutor(address=ray_address, num_cpus=ray_num_cpus, object_store_memory=ray_object_store)
    return SerialExecutor(load=load, progress=progress)


__all__: Sequence[str] = ("Driver", "SerialExecutor", "make_executor")
