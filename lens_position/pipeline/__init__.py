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
- ``run``: ``run(config)`` tying them together; ``sweep``: a TOML sweep spec into a run;
- ``devices``: device and dtype for loading and forward passes; ``measure``: time and memory.
"""

from lens_position.pipeline.config import DEFAULT_MODELS, FULL, QUICK, Compute, DataOptions, RunConfig, Settings
from lens_position.pipeline.run import CellsFailedError, ReportCheckError, RunResult, StepRecord, run
from lens_position.pipeline.steps import STEPS, Step, StepContext, StepOutput

__all__ = ["DEFAULT_MODELS", "FULL", "QUICK", "Compute", "DataOptions", "RunConfig", "Settings", "CellsFailedError",
           "ReportCheckError", "RunResult", "StepRecord", "run", "STEPS", "Step", "StepContext", "StepOutput"]
