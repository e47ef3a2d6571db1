"""A run: plan -> execute -> write -> report.

``run(config)`` checks the configuration and reads the corpora (``plan``), has an executor
compute the cells not already in the step cache (``execute``; the driver here alone writes
the cache), stacks each table over models and conditions and writes the output folder whole
(``write``), then builds ``report.html`` and checks it in headless Chromium (``report``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from lens_position.core.intervals import annotate_intervals
from lens_position.findings import Findings
from lens_position.ground import provenance as provenance_module
from lens_position.ground.errors import LensPositionError, MissingPackageError, is_input_error
from lens_position.ground.progress import note, progress
from lens_position.ground.provenance import jsonable
from lens_position.pipeline import estimate as estimate_module
from lens_position.pipeline import steps as steps_module
from lens_position.pipeline.cache import StepCache
from lens_position.pipeline.config import RunConfig
from lens_position.pipeline.devices import resolve_device
from lens_position.pipeline.executors import make_executor
from lens_position.pipeline.measure import measure
from lens_position.pipeline.models import architecture_label
from lens_position.pipeline.outputs import MANIFEST, OutputFolder
from lens_position.pipeline.plan import Cell, Plan, plan_run
from lens_position.pipeline.worker import CellResult, Loaded
from lens_position.report import html as report_module
from lens_position.report import zoo as zoo_c3

log = logging.getLogger(__name__)


@dataclass
class StepRecord:
    """One step of one model under one condition (or its load, ``step == "load"``): its cache
    key, whether it came from the cache, what it cost here, and its provenance."""

    step: str
    model: str
    key: str
    cached: bool
    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    provenance: dict[str, Any]
    data: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class RunResult:
    """The tables of a run (stacked over models and conditions), its claims table, provenance
    and files."""

    tables: dict[str, pd.DataFrame]
    claims: pd.DataFrame
    provenance: dict[str, Any]
    files: dict[str, Path]
    steps: list[StepRecord]
    #: what the run found (claims, C3 by length, the console's sentences); None for a sweep, whose
    #: conditions each have theirs (in their reports)
    findings: Findings | None = None


class CellsFailedError(LensPositionError, RuntimeError):
    """Some cells of a run failed; every other cell finished and is in the step cache, so
    running the same command again computes only the failed ones."""

    def __init__(self, failures: list[tuple[Cell, BaseException]]):
        self.failures = failures
        lines = [f"{cell.describe()}: {type(error).__name__}: {error}" for cell, error in failures]
        super().__init__(f"{len(failures)} step(s) failed (the others finished and are cached): "
                         + "; ".join(lines))

    @property
    def all_input_errors(self) -> bool:
        return all(is_input_error(error) for _, error in self.failures)


class ReportCheckError(LensPositionError, RuntimeError):
    """The HTML report did not render cleanly in headless Chromium."""


@dataclass
class Collected:
    """What execution gathered: per cell its tables, and the records in plan order."""

    tables: dict[int, dict[str, pd.DataFrame]] = field(default_factory=dict)
    cells: dict[int, Cell] = field(default_factory=dict)
    records: dict[tuple[int, int], StepRecord] = field(default_factory=dict)
    models: dict[int, dict[str, Any]] = field(default_factory=dict)
    failures: list[tuple[Cell, BaseException]] = field(default_factory=list)


class RunDriver:
    """The driver side of execution: checks the cache when a model is loaded, stores each
    computed cell, records everything in plan order (whatever order results arrive in)."""

    def __init__(self, plan: Plan, cache: StepCache, *, use_cache: bool, bar: Any = None, announce: bool = False):
        self.plan = plan
        self.cache = cache
        self.use_cache = use_cache
        self.bar = bar  # a progress counting finished cells (parallel executors), or None
        self.announce = announce  # print each model's run-time estimate before its steps
        self.collected = Collected()

    def on_loaded(self, model: str, model_index: int, loaded: Loaded) -> list[Cell]:
        spec = loaded.spec
        label, role = architecture_label(spec, model)
        self.collected.models[model_index] = {**jsonable(spec), "request": model, "architecture": label,
                                              "role": role, "load_wall_s": round(loaded.cost["wall_s"], 3)}
        self.collected.records[(model_index, -1)] = StepRecord(
            "load", model, "", False, loaded.cost["wall_s"], loaded.cost["cpu_s"], loaded.cost["peak_rss_mb"],
            {"model": jsonable(spec)})
        pending = []
        for cell in self.plan.cells_for_model(model, spec, model_index):
            with measure() as cost:
                hit = self.cache.load(cell.step, cell.model, cell.key) if self.use_cache else None
            if hit is None:
                pending.append(cell)
                continue
            tables, prov = hit
            self._record(cell, tables, prov, cost, cached=True)
        if self.announce and pending:
            note(estimate_module.announce(model, pending, spec, self.plan.compute, loaded.block_overhead_s))
        return pending

    def on_result(self, cell: Cell, result: CellResult) -> None:
        self.cache.store(cell.step, cell.model, cell.key, result.tables, result.provenance)
        self._record(cell, result.tables, result.provenance, result.cost, cached=False)

    def on_failure(self, cell: Cell, error: BaseException) -> None:
        log.error("%s failed: %s: %s", cell.describe(), type(error).__name__, error)
        self.collected.failures.append((cell, error))
        self._count(cell)

    def _record(self, cell: Cell, tables: Mapping[str, pd.DataFrame], prov: Mapping[str, Any],
                cost: Mapping[str, float], *, cached: bool) -> None:
        c = self.collected
        c.tables[cell.index] = dict(tables)
        c.cells[cell.index] = cell
        model_index = self.plan.models.index(cell.model)
        c.records[(model_index, cell.index)] = StepRecord(
            cell.step, cell.model, cell.key, cached, cost["wall_s"], cost["cpu_s"], cost["peak_rss_mb"],
            dict(prov), cell.condition.data.to_dict() if len(self.plan.conditions) > 1 else None)
        self._count(cell)

    def _count(self, cell: Cell) -> None:
        if self.bar is not None:
            self.bar.set_postfix(f"last: {cell.model} / {cell.step}")
            self.bar.update(1)


def execute(plan: Plan, config: RunConfig, cache: StepCache, *, load: Callable[[str], Any] | None = None,
            steps: Mapping[str, steps_module.Step] | None = None) -> Collected:
    """Compute every cell of ``plan`` that is not in ``cache`` on the configured executor.

    With ``config.progress`` (``lens_position.ground.progress``): the serial executor shows one bar
    per computed cell, counting its sequences; the Ray executor, whose cells run at once in
    other processes, one bar counting finished cells (cached ones included)."""
    executor = make_executor(config.executor, load=load, progress=config.progress,
                             ray_address=config.ray_address, ray_num_cpus=config.ray_num_cpus)
    registry = steps if steps is not None else steps_module.STEPS
    if config.executor != "ray":
        driver = RunDriver(plan, cache, use_cache=config.use_cache, announce=config.progress)
        executor.execute(plan, registry, driver)
        return driver.collected
    with progress("reproduce", total=plan.n_cells, unit="cells", enabled=config.progress) as bar:
        driver = RunDriver(plan, cache, use_cache=config.use_cache, bar=bar, announce=config.progress)
        executor.execute(plan, registry, driver)
    return driver.collected


def _tag(frame: pd.DataFrame, tags: Mapping[str, Any]) -> pd.DataFrame:
    frame = frame.copy()
    for col, value in reversed(list(tags.items())):
        if col in frame.columns:
            frame = frame.drop(columns=col)
        frame.insert(0, col, value)
    return frame


def stack_tables(plan: Plan, collected: Collected, factors: tuple[str, ...] = ()) -> dict[str, pd.DataFrame]:
    """Each table stacked over cells in plan order, with ``architecture``, ``role`` and ``model``
    in front, then one column per sweep factor (``factors``: fields of the data condition)."""
    pieces: dict[str, list[pd.DataFrame]] = {}
    for index in sorted(collected.tables):
        cell = collected.cells[index]
        info = collected.models[plan.models.index(cell.model)]
        data = cell.condition.data.to_dict()
        tags = {"architecture": info["architecture"], "role": info["role"], "model": cell.model,
                **{f: data[f] for f in factors}}
        for table, frame in collected.tables[index].items():
            pieces.setdefault(table, []).append(_tag(frame, tags))
    return {name: pd.concat(frames, ignore_index=True) for name, frames in pieces.items()}


def known_output_names() -> set[str]:
    """Every file name a run of this package may write in its output folder."""
    names = {"claims.csv", "claims_by_length.csv", "report.html", "report.png", *zoo_c3.ZOO_OUTPUTS}
    for table in steps_module.TABLES:
        names |= {f"{table}.parquet", f"{table}.csv"}
    return names


# Per-condition reports of a sweep.
KNOWN_PATTERNS = ("report-*.html",)


def run_provenance(config: RunConfig, plan: Plan, collected: Collected) -> dict[str, Any]:
    records = [collected.records[k] for k in sorted(collected.records)]
    prov: dict[str, Any] = {
        "command": config.command,
        "steps_requested": list(plan.steps),
        "models": [collected.models[i] for i in sorted(collected.models)],
        "data": config.data.to_dict() if len(plan.conditions) == 1 else None,
        "corpus_sha256": plan.conditions[0].corpus_sha256 if len(plan.conditions) == 1 else None,
        "settings": dataclasses.asdict(plan.settings),
        "compute": plan.compute.to_dict(),
        "quick": config.quick,
        "seed": config.data.seed if len(plan.conditions) == 1 else None,
        "versions": provenance_module.package_versions(),
        "created": provenance_module.collect()["created"],
        "execution": {"executor": config.executor, "ray_address": config.ray_address},
        "steps": [r.to_dict() for r in records],
    }
    if len(plan.conditions) > 1:
        prov["conditions"] = [{**c.data.to_dict(), "corpus_sha256": c.corpus_sha256} for c in plan.conditions]
    computed = [r.provenance.get("computed_cost", {}).get("wall_s") for r in records if r.step != "load"]
    prov["steps_reused"] = sum(r.cached for r in records)
    if computed and all(c is not None for c in computed):
        prov["steps_computed_wall_s"] = round(sum(computed), 3)  # as first computed, cached or not
    return prov


def write_outputs(folder: OutputFolder, tables: Mapping[str, pd.DataFrame], claims: pd.DataFrame,
                  fmt: str) -> dict[str, Path]:
    """The tables and the claims, each written whole; a table with intervals gets the columns
    that say which method made them and where an estimate lies outside its own
    (:func:`lens_position.core.intervals.annotate_intervals`)."""
    files = {name: folder.table(name, annotate_intervals(frame), fmt) for name, frame in tables.items()}
    files["claims"] = folder.table("claims", claims, "csv")
    return files


def write_report(folder: OutputFolder, findings: Findings, prov: dict[str, Any],
                 browser_check: bool) -> tuple[dict[str, Path], Any]:
    """``report.html`` (written whole) and, if asked, its check in Chromium with a screenshot."""
    files = {"report": folder.text("report", "report.html", report_module.build_report(
        findings, provenance=prov, figures=steps_module.FIGURES))}
    check = None
    if browser_check:
        try:
            shot = folder.out / "report.png"
            holder: dict[str, Any] = {}

            def screenshot(tmp: Path) -> None:
                tmp.unlink()  # so that only Chromium's own file counts as a screenshot
                holder["check"] = report_module.check_in_browser(files["report"], screenshot=tmp)
                if holder["check"].screenshot is None:
                    raise FileNotFoundError(tmp)

            try:
                folder.file("screenshot", "report.png", screenshot)
                files["screenshot"] = shot
                holder["check"].screenshot = shot.resolve()
            except FileNotFoundError:  # Chromium drew no screenshot: the check records why
                pass
            check = holder.get("check")
            prov["browser_check"] = check.to_dict() if check is not None else {"ok": False}
        except MissingPackageError as error:
            log.warning("report not checked in a browser: %s", error)
            prov["browser_check"] = {"ok": None, "skipped": str(error)}
    return files, check


def run(config: RunConfig, *, load: Callable[[str], Any] | None = None,
        steps: Mapping[str, steps_module.Step] | None = None, started: float | None = None) -> RunResult:
    """Run ``config.steps`` on every model in ``config.models`` under every data condition and
    write the output folder.

    ``load`` maps a model request to a ``LoadedModel`` (default: ``load_model`` offline; serial
    executor only); ``steps`` replaces the step registry (tests). Returns the stacked tables,
    the claims table, the provenance and the files written. Raises ``CellsFailedError`` after
    every other cell finished when some cells failed (their results are cached; nothing is
    written to the output folder), ``ReportCheckError`` when the report does not render.
    ``started``: the ``time.perf_counter()`` the wall time in the provenance counts from (the
    command line's start, so that its imports and checks are counted; default: now).
    """
    started = time.perf_counter() if started is None else started
    plan = plan_run(config, check_model_names=load is None)
    if config.executor != "ray":  # a Ray cluster's GPUs are its workers', not this machine's
        resolve_device(config.compute.device, n_devices=config.compute.n_devices)
    with OutputFolder(config.out, known_output_names(), KNOWN_PATTERNS, force=config.force) as folder:
        return _run_into(folder, config, plan, started, load=load, steps=steps)


def _run_into(folder: OutputFolder, config: RunConfig, plan: Plan, started: float, *,
              load: Callable[[str], Any] | None, steps: Mapping[str, steps_module.Step] | None) -> RunResult:
    cache = StepCache(folder.out / "cache")
    collected = execute(plan, config, cache, load=load, steps=steps)
    if collected.failures:
        raise CellsFailedError(collected.failures)

    factors = tuple(config.factors)
    tables = stack_tables(plan, collected, factors)
    # what the run found, once: one Findings per condition of a sweep, one for a reproduction
    conditions = findings_by_condition(tables, factors)
    claims = stack_claims(conditions)
    findings = conditions[0][1] if not factors else None
    prov = run_provenance(config, plan, collected)
    folder.begin({"command": config.command, "started": prov["created"]})
    files = write_outputs(folder, tables, claims, config.fmt)
    if findings is not None:  # a sweep's conditions each have their report, which shows C3 at each T
        if len(findings.by_length):
            files["claims_by_length"] = folder.table("claims_by_length", findings.by_length, "csv")
        files.update(zoo_c3.write_outputs(folder, findings))
    prov["wall_time_s"] = round(time.perf_counter() - started, 3)
    if findings is None:
        report_files, checks = write_sweep_reports(folder, conditions, claims, prov, config.browser_check)
    else:
        report_files, check = write_report(folder, findings, prov, config.browser_check)
        checks = {"report.html": check} if check is not None else {}
    files.update(report_files)
    prov["wall_time_s"] = round(time.perf_counter() - started, 3)
    files["provenance"] = folder.finish(prov)
    for name, check in checks.items():
        if not check.ok:
            raise ReportCheckError(
                f"the report {folder.out / name} failed its browser check: {len(check.undrawn)} figure(s) not "
                f"drawn ({', '.join(check.undrawn) or 'none'}), JavaScript errors: {check.js_errors or 'none'}")
    records = [collected.records[k] for k in sorted(collected.records)]
    return RunResult(tables=tables, claims=claims, provenance=prov, files=files, steps=records, findings=findings)


def findings_by_condition(tables: Mapping[str, pd.DataFrame], factors: tuple[str, ...]
                          ) -> list[tuple[dict[str, Any], Findings]]:
    """What the run found: one :class:`~lens_position.findings.Findings` (``({}, findings)``) or, in a
    sweep, one per condition with its factor values."""
    if not factors:
        return [({}, Findings.of(tables))]
    from lens_position.pipeline.sweep import split_by_condition

    return [(values, Findings.of(subset)) for values, subset in split_by_condition(tables)]


def stack_claims(conditions: list[tuple[dict[str, Any], Findings]]) -> pd.DataFrame:
    """The claims table (``claims.csv``): the findings' own, or a sweep's, one per condition with its
    factor values in front, stacked."""
    if len(conditions) == 1 and not conditions[0][0]:
        return conditions[0][1].claims
    return pd.concat([_tag(findings.claims, values) for values, findings in conditions], ignore_index=True)


def write_sweep_reports(folder: OutputFolder, conditions: list[tuple[dict[str, Any], Findings]],
                        claims: pd.DataFrame, prov: dict[str, Any], browser_check: bool
                        ) -> tuple[dict[str, Path], dict[str, Any]]:
    """A report per condition and the sweep's ``report.html`` linking them, each written whole;
    with ``browser_check``, each condition's report is opened in Chromium."""
    from lens_position.pipeline.sweep import condition_slug, sweep_index_html

    files: dict[str, Path] = {}
    reports: dict[str, str] = {}
    checks: dict[str, Any] = {}
    for values, findings in conditions:
        slug = condition_slug(values)
        name = f"report-{slug}.html"
        reports[slug] = name
        files[f"report-{slug}"] = folder.text(f"report-{slug}", name, report_module.build_report(
            findings, provenance={**prov, "condition": values},
            title=f"lens_position: {values['source']} text, BOS {values['bos']}, seed {values['seed']}",
            figures=steps_module.FIGURES))
        if browser_check:
            try:
                checks[name] = report_module.check_in_browser(files[f"report-{slug}"])
            except MissingPackageError as error:
                log.warning("reports not checked in a browser: %s", error)
                prov["browser_check"] = {"ok": None, "skipped": str(error)}
                browser_check = False
    if checks:
        prov["browser_check"] = {name: check.to_dict() for name, check in checks.items()}
    files["report"] = folder.text("report", "report.html", sweep_index_html(claims, reports, prov))
    return files, checks


__all__ = ["CellsFailedError", "ReportCheckError", "RunResult", "StepRecord", "run", "MANIFEST"]
