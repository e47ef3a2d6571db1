"""The reproduction pipeline: steps as values, plan -> execute -> write -> report.

Modules, each with one job:

- ``config``: what a run is asked to do (``RunConfig``, ``Settings``, ``DataOptions``, ``Compute``);
- ``steps``: the step registry ``STEPS`` (name, tables, sub-command, sizes, how it runs);
- ``plan``: checks a configuration, reads corpora, resolves cells (model x condition x step)
  with sizes and cache keys;
- ``cache``: the step cache, keyed by content;
- ``worker``: a loaded model running its cells (in this process or in a Ray actor);
- ``executors``: serial; ``ray_executor``: Ray (an actor per model, cells as tasks);
- ``outputs``: the output folder, written whole with its manifest last;
- ``runner``: ``run(config)`` tying them together; ``sweep``: a TOML sweep spec into a run;
- ``devices``: device and dtype for loading and forward passes; ``measure``: time and memory.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the lazy names are, for type checkers and the API reference
    from lens_position.pipeline.config import DEFAULT_MODELS, FULL, QUICK, Compute, DataOptions, RunConfig, Settings
    from lens_position.pipeline.runner import CellsFailedError, ReportCheckError, RunResult, StepRecord, run
    from lens_position.pipeline.steps import STEPS, Step, StepContext, StepOutput

# Each name is imported on first use: the command line's parser reads the step registry
# (``pipeline.steps``) without importing the run (``pipeline.runner``) and what it pulls in.
_EXPORTS = {
    **dict.fromkeys(["DEFAULT_MODELS", "FULL", "QUICK", "Compute", "DataOptions", "RunConfig", "Settings"],
                    "lens_position.pipeline.config"),
    **dict.fromkeys(["CellsFailedError", "ReportCheckError", "RunResult", "StepRecord", "run"],
                    "lens_position.pipeline.runner"),
    **dict.fromkeys(["STEPS", "Step", "StepContext", "StepOutput"], "lens_position.pipeline.steps"),
}
# A literal list: the API reference reads it without running the module.
__all__ = ["DEFAULT_MODELS", "FULL", "QUICK", "CellsFailedError", "Compute", "DataOptions", "ReportCheckError",
           "RunConfig", "RunResult", "STEPS", "Settings", "Step", "StepContext", "StepOutput", "StepRecord", "run"]


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
