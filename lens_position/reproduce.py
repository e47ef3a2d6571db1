"""The reproduction of claims C1-C5: the public entry points, kept here for existing callers.

The work lives in ``lens_position.pipeline`` (steps as values, plan -> execute -> write ->
report, serial and Ray executors). ``run(RunConfig(...))`` runs the configured steps on every
model and writes the output folder: tables stacked over models (columns ``architecture``,
``role`` and ``model`` in front), the claims table, ``report.html`` (checked in headless
Chromium, screenshot ``report.png``) and, last, the manifest ``provenance.json``. Every step's
result is cached under ``<out>/cache/`` keyed by its full configuration, so an interrupted
run resumes where it stopped.
"""

from __future__ import annotations

from lens_position.pipeline.cache import StepCache, jsonable, step_key
from lens_position.pipeline.config import DEFAULT_MODELS, FULL, QUICK, Compute, DataOptions, RunConfig, Settings
from lens_position.pipeline.measure import measure
from lens_position.pipeline.models import architecture_label, check_models, load_request, parse_model_request
from lens_position.pipeline.outputs import load_tables, prepare_output, write_table
from lens_position.pipeline.run import CellsFailedError, ReportCheckError, RunResult, StepRecord, run
from lens_position.pipeline.steps import STEPS as STEP_REGISTRY
from lens_position.pipeline.steps import commands, step_names

# Step names in run order, and the sub-commands of the command line with the steps each runs
# (both read from the registry ``lens_position.pipeline.steps.STEPS``).
STEPS: tuple[str, ...] = step_names()
COMMAND_STEPS: dict[str, tuple[str, ...]] = commands()

__all__ = ["DEFAULT_MODELS", "FULL", "QUICK", "Compute", "DataOptions", "RunConfig", "Settings", "StepCache",
           "jsonable", "step_key", "measure", "architecture_label", "check_models",
           "load_request", "parse_model_request", "load_tables", "prepare_output", "write_table",
           "CellsFailedError", "ReportCheckError", "RunResult", "StepRecord", "run", "STEP_REGISTRY", "STEPS",
           "COMMAND_STEPS"]
