"""The reproduction end to end on tiny models: every output file, the claims table, figures that
hold exactly the numbers of the tables, a clean render in Chromium, and resume from the cache."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import subprocess
import sys
from html import escape
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lens_position.analyses.claims import claims_table
from lens_position.cli.commands import EXIT_INTERRUPTED, main
from lens_position.ground.errors import BadInputError
from lens_position.pipeline.outputs import load_tables
from lens_position.pipeline.steps import STEPS as STEP_REGISTRY
from lens_position.pipeline.steps import TABLES, step_names, tables_of
from lens_position.report.html import report_figure_specs

DEFAULT_TABLES = tables_of(step_names())  # a run without opt-in steps writes these
# a model without massive activations (100 and 1000x the median) has no entries and nothing to intervene on
PER_MODEL_OPTIONAL = {"massive_entries", "massive_intervention"}
from lens_position.pipeline.cache import StepCache, step_key
from lens_position.pipeline.models import parse_model_request

MODELS = "tiny-llama,tiny-llama@ntk_alpha=8,tiny-gemma3"
ARCHITECTURES = {"standard RoPE: tiny-llama", "NTK-scaled RoPE: tiny-llama@ntk_alpha=8",
                 "sliding window: tiny-gemma3"}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("reproduce") / "results"
    status = main(["reproduce", "--quick", "--models", MODELS, "--out", str(out), "--no-progress"])
    assert status == 0
    return out


def _provenance(out: Path) -> dict:
    return json.loads((out / "provenance.json").read_text())


def test_quick_reproduce_writes_every_output_file(quick_run):
    assert set(TABLES) - set(DEFAULT_TABLES) == {"prompt_sets", "prompt_sets_summary"}  # opt-in: --prompt-sets
    assert not (quick_run / "prompt_sets.parquet").exists()
    for name in DEFAULT_TABLES:
        if name in PER_MODEL_OPTIONAL and not (quick_run / f"{name}.parquet").exists():
            continue
        frame = pd.read_parquet(quick_run / f"{name}.parquet")
        if name in PER_MODEL_OPTIONAL:  # rows only for the models that hold massive activations
            assert set(frame.get("architecture", pd.Series(dtype=object))) <= ARCHITECTURES, name
            continue
        assert len(frame) > 0, name
        assert set(frame["architecture"]) == ARCHITECTURES, name
        assert {"model", "role"} <= set(frame.columns)
    for name in ("claims.csv", "provenance.json", "report.html", "report.png"):
        assert (quick_run / name).stat().st_size > 0, name
    assert (quick_run / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_provenance_names_models_data_seed_versions_and_timings(quick_run):
    prov = _provenance(quick_run)
    assert [m["request"] for m in prov["models"]] == MODELS.split(",")
    for model in prov["models"]:
        assert len(model["weights_sha256"]) == 64
        assert model["architecture"] in ARCHITECTURES
    assert prov["models"][1]["ntk_alpha"] == 8.0 and prov["models"][1]["role"] == "ntk"
    assert prov["data"] == {"source": "natural", "corpus": None, "bos": "force", "seed": 0}
    assert prov["seed"] == 0 and prov["quick"] is True
    assert {"torch", "transformer_lens", "lens_position", "python"} <= set(prov["versions"])
    steps = [s for s in prov["steps"] if s["step"] != "load"]
    assert len(steps) == 3 * len(step_names())
    for step in steps:
        assert step["wall_s"] > 0 and step["cpu_s"] > 0 and step["peak_rss_mb"] > 0 and len(step["key"]) == 64
        assert step["provenance"]["model"]["weights_sha256"]  # each experiment's own provenance
    assert prov["wall_time_s"] >= sum(s["wall_s"] for s in prov["steps"])
    assert prov["browser_check"]["ok"] is True


def test_claims_table_is_computed_from_the_written_tables(quick_run):
    claims = pd.read_csv(quick_run / "claims.csv")
    assert list(dict.fromkeys(claims["claim"])) == ["C1", "C2", "C3", "C4", "C5"]
    assert set(claims["architecture"]) == ARCHITECTURES | {"overall"}
    recomputed = claims_table(load_tables(quick_run))
    assert claims["measured"].tolist() == recomputed["measured"].tolist()
    assert np.allclose(claims["value"].to_numpy(float), recomputed["value"].to_numpy(float), equal_nan=True)
    # C1 is the held-out total signal averaged over layers, per architecture.
    layers = pd.read_parquet(quick_run / "decompose_layers.parquet")
    c1 = claims[(claims["claim"] == "C1") & (claims["architecture"] != "overall")]
    for row in c1.itertuples():
        assert row.value == pytest.approx(layers[layers["architecture"] == row.architecture]["total_heldout"].mean())
    # The report opens with the same table.
    html = (quick_run / "report.html").read_text()
    assert html.index('id="claims"') < html.index('class="figure"')
    for measured in claims["measured"]:
        assert escape(measured) in html
    # Every (claim, architecture) has a three-state verdict and, where it does not hold, words saying why.
    rows = claims[claims["architecture"] != "overall"]
    assert set(rows["verdict"]) <= {"holds", "does not hold", "inconclusive at this N", "not measured"}
    assert {"value_lo", "value_hi", "n_to_decide", "explanation"} <= set(claims.columns)
    for row in rows[rows["verdict"].isin(["does not hold", "inconclusive at this N"])].itertuples():
        assert isinstance(row.explanation, str) and escape(row.explanation) in html


def _close(a, b) -> bool:
    if a is None or b is None or (isinstance(b, float) and math.isnan(b)):
        return a is None and (b is None or math.isnan(b))
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def _check_lines(traces, frame, quantity_to_column, x="layer"):
    """Every line trace ``meta.quantity`` equals its column of ``frame``, by architecture, sorted by layer."""
    checked = 0
    for trace in traces:
        quantity = trace["meta"]["quantity"]
        if quantity not in quantity_to_column:
            continue
        column, condition = quantity_to_column[quantity]
        part = frame[frame["architecture"] == trace["meta"]["group"]]
        if condition is not None:
            part = part[part[condition[0]] == condition[1]]
        part = part.sort_values("layer")
        expected = part[column].tolist()
        if column == "spread":  # zero spread is drawn as a gap on the log axis
            expected = [None if v == 0 else v for v in expected]
        assert all(_close(a, b) for a, b in zip(trace["x"], part[x].tolist()))
        assert all(_close(a, b) for a, b in zip(trace["y"], expected)) and len(trace["y"]) == len(expected)
        checked += 1
    return checked


def test_every_figure_in_the_report_holds_the_tables_numbers(quick_run):
    tables = load_tables(quick_run)
    specs = report_figure_specs((quick_run / "report.html").read_text())
    assert set(specs) == {"layer_components", "layer_components_early", "head_heatmaps", "probe", "bos",
                          "fingerprint", "sinks", "sink_rate", "sink_ablation", "convergence", "window_sinks",
                          "rotary_bands", "length_sweep", "sink_origin", "massive", "rollout", "leakage"}
    n = len(ARCHITECTURES)

    by_length = tables["length_sweep"]  # each component against T: one line per model and component
    lines = [t for t in specs["length_sweep"]["data"] if t["meta"]["quantity"] != "window"]
    assert len(lines) == 4 * n
    for trace in lines:
        part = by_length[(by_length["architecture"] == trace["meta"]["group"])
                         & (by_length["quantity"] == trace["meta"]["quantity"])].sort_values("seq_len")
        assert trace["x"] == part["seq_len"].tolist()
        assert all(_close(a, b) for a, b in zip(trace["y"], part["value"].tolist()))

    layers = tables["decompose_layers"]
    components = {c: (c, None) for c in ("R_rf_heldout", "M_rf_heldout", "R_heldout", "M_heldout")}
    assert _check_lines(specs["layer_components"]["data"], layers, components,
                        x="relative_depth" if "relative_depth" in layers.columns else "layer") == \
        n * sum(c in layers.columns for c in components)

    early = tables["decompose_early_layers"]  # C2 at early queries, from the base run of BOS replacement
    assert _check_lines(specs["layer_components_early"]["data"], early, components, x="relative_depth") == \
        n * sum(c in early.columns for c in components)

    heads = tables["decompose_heads"]
    for trace in specs["head_heatmaps"]["data"]:
        part = heads[heads["architecture"] == trace["meta"]["group"]]
        col = trace["meta"]["quantity"]
        for row in part.itertuples():
            value = trace["z"][trace["y"].index(row.layer)][trace["x"].index(row.head)]
            assert _close(value, getattr(row, col))
    assert len(specs["head_heatmaps"]["data"]) == 3 * n

    assert _check_lines(specs["probe"]["data"], tables["probe_layers"],
                        {"r2_heldout": ("r2_heldout", None), "r2_shuffled": ("r2_shuffled", None)}) == 2 * n

    reps = tables["bos_overall"]["replacement"].unique().tolist()
    assert _check_lines(specs["bos"]["data"], tables["bos_layers"],
                        {f"fraction_removed_rf_heldout ({r})": ("fraction_removed_rf_heldout", ("replacement", r))
                         for r in reps}
                        ) == len(reps) * n
    overall = tables["bos_overall"]
    bars = [t for t in specs["bos"]["data"] if t["type"] == "bar"]
    assert len(bars) == n
    for trace in bars:
        part = overall[overall["architecture"] == trace["meta"]["group"]]
        assert trace["x"] == part["replacement"].tolist()
        # the held-out reference-free fraction: what C4 is decided on
        assert all(_close(a, b) for a, b in zip(trace["y"], part["fraction_removed_rf_heldout"]))

    conds = ("auto-bos", "varying-token0")
    assert _check_lines(specs["fingerprint"]["data"], tables["fingerprint"],
                        {**{f"spread ({c})": ("spread", ("condition", c)) for c in conds},
                         **{f"norm ({c})": ("norm", ("condition", c)) for c in conds}}) == 4 * n

    sinks, reading = tables["sink_heads"], tables["sink_reading"]
    for trace in specs["sinks"]["data"]:
        arch, quantity = trace["meta"]["group"], trace["meta"]["quantity"]
        part = sinks[sinks["architecture"] == arch]
        if quantity == "sink_score":
            for row in part.itertuples():
                assert _close(trace["z"][trace["y"].index(row.layer)][trace["x"].index(row.head)], row.sink_score)
        elif quantity == "is_sink":
            sink = part[part["is_sink"]]
            assert sorted(zip(trace["y"], trace["x"])) == sorted(zip(sink["layer"], sink["head"]))
        else:
            top = reading[reading["architecture"] == arch].sort_values("reading_rank").head(len(trace["x"]))
            assert list(zip(trace["y"], trace["x"])) == list(zip(top["layer"], top["head"]))

    rates = tables["sink_rate"]
    for trace in specs["sink_rate"]["data"]:
        part = rates[rates["architecture"] == trace["meta"]["group"]]
        column = {"sink_rate_percent": "sink_rate", "sink_rate_pooled_percent": "sink_rate_pooled"}[
            trace["meta"]["quantity"]]
        assert trace["x"] == part["condition"].tolist()
        assert all(_close(a, 100 * b) for a, b in zip(trace["y"], part[column]))

    kinds = tables["sink_ablation"]["ablation"].unique().tolist()
    assert _check_lines(specs["sink_ablation"]["data"], tables["sink_ablation"],
                        {**{f"R_heldout_before ({k})": ("R_heldout_before", ("ablation", k)) for k in kinds},
                         **{f"R_heldout_after ({k})": ("R_heldout_after", ("ablation", k)) for k in kinds}}
                        ) == 2 * len(kinds) * n

    origin = tables["sink_origin"]  # sink rate by BOS condition, at position 0 and at the BOS
    bars = specs["sink_origin"]["data"]
    assert len(bars) == 2 * n
    for trace in bars:
        location = trace["meta"]["quantity"].removeprefix("sink_rate_").removesuffix("_percent")
        part = origin[(origin["architecture"] == trace["meta"]["group"]) & (origin["location"] == location)
                      & origin["sink_rate"].notna()]
        assert trace["x"] == part["condition"].tolist() and len(trace["x"]) > 0
        assert all(_close(a, 100 * b) for a, b in zip(trace["y"], part["sink_rate"]))

    assert _check_lines(specs["massive"]["data"], tables["massive_layers"],
                        {"top1": ("top1", None), "median_abs": ("median_abs", None)}) == 2 * n

    rollout = tables["rollout_layers"]  # flow to position 0 by depth, in %
    traces = specs["rollout"]["data"]
    assert len(traces) == 2 * n
    for trace in traces:
        part = rollout[rollout["architecture"] == trace["meta"]["group"]].sort_values("layer")
        column = trace["meta"]["quantity"].removesuffix("_percent")
        assert trace["x"] == part["layer"].tolist()
        assert all(_close(a, 100 * b) for a, b in zip(trace["y"], part[column]))


    leakage = specs["leakage"]["data"]  # ΔR² on texts and nulls (left) beside R' and M' (right), per layer
    assert _check_lines(leakage, tables["leakage_layers"],
                        {"delta_r2": ("delta_r2", None), "delta_r2_null": ("delta_r2_null", None)}) == 2 * n
    assert _check_lines(leakage, layers, {"R_rf_heldout": ("R_rf_heldout", None),
                                          "M_rf_heldout": ("M_rf_heldout", None)}) == 2 * n


def test_report_shows_the_published_numbers_beside_the_runs(quick_run):
    """The published-numbers section holds, for every model of the run, its leakage and sink-rate rows as
    the run's tables give them."""
    from lens_position.analyses.published import published_beside_ours

    tables = {name: pd.read_parquet(quick_run / f"{name}.parquet")
              for name in ("leakage_heads", "leakage_seeds", "sink_rate")}
    section = re.search(r'<section id="published">.*?</section>', (quick_run / "report.html").read_text(), re.S)
    assert section is not None
    ours = published_beside_ours(tables).query("not published")
    assert set(ours["model"]) == set(tables["sink_rate"]["model"]) and len(ours) == 2 * len(set(ours["model"]))
    for value in ours["value"]:
        assert escape(value) in section.group(0)


def test_report_was_drawn_by_chromium_without_errors(quick_run):
    check = _provenance(quick_run)["browser_check"]
    assert check["js_errors"] == [] and check["undrawn"] == []
    assert check["figures_drawn"] == check["figures_expected"] == 17
    assert Path(check["screenshot"]) == (quick_run / "report.png").resolve()


def test_same_command_again_reuses_every_step(quick_run, capsys):
    before = {name: pd.read_parquet(quick_run / f"{name}.parquet") for name in DEFAULT_TABLES
              if name not in PER_MODEL_OPTIONAL or (quick_run / f"{name}.parquet").exists()}
    assert main(["reproduce", "--quick", "--models", MODELS, "--out", str(quick_run), "--no-progress",
                 "--no-browser-check"]) == 0
    steps = [s for s in _provenance(quick_run)["steps"] if s["step"] != "load"]
    assert steps and all(s["cached"] for s in steps)
    for name, frame in before.items():
        pd.testing.assert_frame_equal(pd.read_parquet(quick_run / f"{name}.parquet"), frame)
    # the console summary of a reproduction fits one screen: the answer per architecture, the verdicts,
    # the report's path; the sentences are in the report
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) <= 40
    assert all(any(re.match(rf"{re.escape(arch)} at T = \d+: total", line.strip()) for line in printed)
               for arch in ARCHITECTURES)
    assert all(any(line.strip().startswith(f"{claim}:") for line in printed) for claim in ("C1", "C2", "C3", "C4"))
    assert printed[-1].startswith("report: ")


def test_an_interrupted_run_resumes_from_its_finished_steps(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    argv = ["sinks", "tiny-llama", "--quick", "--out", str(out), "--no-progress"]
    calls: list[str] = []
    original = dict(STEP_REGISTRY)

    def counting(step):
        def run_step(ctx, sizes):
            calls.append(step)
            return original[step].run(ctx, sizes)
        return dataclasses.replace(original[step], run=run_step)

    def interrupt(ctx, sizes):
        raise KeyboardInterrupt

    for step in ("sink_heads", "sink_rate", "sink_reading"):
        monkeypatch.setitem(STEP_REGISTRY, step, counting(step))
    monkeypatch.setitem(STEP_REGISTRY, "sink_reading", dataclasses.replace(original["sink_reading"], run=interrupt))
    assert main(argv) == EXIT_INTERRUPTED
    assert "resume" in capsys.readouterr().err
    assert calls == ["sink_heads", "sink_rate"]

    monkeypatch.setitem(STEP_REGISTRY, "sink_reading", counting("sink_reading"))
    calls.clear()
    assert main(argv) == 0
    assert calls == ["sink_reading"]  # the two finished steps came from the cache
    cached = {s["step"]: s["cached"] for s in _provenance(out)["steps"] if s["step"] != "load"}
    assert cached == {"sink_heads": True, "sink_rate": True, "sink_origin": True, "massive": True, "rollout": True,
                      "sink_reading": False, "window_sinks": False}  # finished before the interruption: cached

    calls.clear()
    assert main(argv + ["--seed", "1"]) == 0  # another configuration: computed afresh
    assert calls == ["sink_heads", "sink_rate", "sink_reading"]


def test_subcommand_writes_csv_tables_and_a_report(tmp_path):
    out = tmp_path / "probe"
    assert main(["probe", "tiny-qwen2", "--quick", "--format", "csv", "--source", "random", "--T", "24",
                 "--out", str(out), "--no-progress"]) == 0
    frame = pd.read_csv(out / "probe_layers.csv")
    assert frame["layer"].tolist() == list(range(len(frame))) and len(frame) >= 3
    assert {"r2_heldout_lo", "r2_heldout_hi", "r2_shuffled_lo", "r2_shuffled_hi"} <= set(frame.columns)
    assert ((frame["r2_heldout_lo"] <= frame["r2_heldout"]) & (frame["r2_heldout"] <= frame["r2_heldout_hi"])).all()
    assert (out / "report.html").is_file() and not (out / "report.png").exists()
    prov = _provenance(out)
    intervals = prov["steps"][-1]["provenance"]["options"]["intervals"]
    assert {"method", "level", "n_resamples", "units", "training_units"} <= set(intervals)
    assert "held-out" in intervals["scope"] and "jackknife over the training units" in intervals["scope"]
    assert prov["settings"]["T"] == 24 and prov["data"]["source"] == "random"
    assert [s["step"] for s in prov["steps"]] == ["load", "probe"]


def test_step_key_depends_on_the_configuration_not_on_how_the_load_went():
    spec = {"name": "m", "weights_sha256": "a" * 64, "extra": {"from_cache": False, "load_seconds": 3.0}}
    warm = {**spec, "extra": {"from_cache": True, "load_seconds": 0.2}}
    config = {"data": {"seed": 0}, "T_model": 32}
    assert step_key("decompose", spec, config) == step_key("decompose", warm, config)
    assert step_key("decompose", spec, config) != step_key("probe", spec, config)
    assert step_key("decompose", spec, config) != step_key("decompose", {**spec, "weights_sha256": "b" * 64}, config)
    assert step_key("decompose", spec, config) != step_key("decompose", spec, {**config, "T_model": 33})


def test_step_cache_ignores_unfinished_and_corrupt_results(tmp_path):
    cache = StepCache(tmp_path)
    key = "k" * 64
    frame = pd.DataFrame({"layer": [0, 1], "R": [0.1, 0.2]})
    assert cache.load("decompose", "m", key) is None
    folder = cache.store("decompose", "m", key, {"decompose_layers": frame}, {"seed": 0})
    tables, prov = cache.load("decompose", "m", key)
    pd.testing.assert_frame_equal(tables["decompose_layers"], frame)
    assert prov == {"seed": 0}
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no temporary left over
    (folder / "decompose_layers.parquet").write_bytes(b"truncated")
    assert cache.load("decompose", "m", key) is None
    assert cache.load("decompose", "m", "j" * 64) is None


def test_model_requests_carry_load_options():
    assert parse_model_request("tiny-llama") == ("tiny-llama", {})
    assert parse_model_request("tiny-llama@ntk_alpha=8") == ("tiny-llama", {"ntk_alpha": 8.0})
    assert parse_model_request("x@ntk_by_parts@window=64") == ("x", {"ntk_by_parts": {}, "window": 64})
    assert parse_model_request('x@ntk_by_parts={"factor": 4}') == ("x", {"ntk_by_parts": {"factor": 4}})
    for bad in ("x@alpha=2", "x@window=wide", "@window=3", "x@ntk_by_parts=[1]"):
        with pytest.raises(BadInputError):
            parse_model_request(bad)


_MEASURE_SCRIPT = """
import json, time
import numpy as np
from lens_position.pipeline.measure import measure
with measure() as small:
    pass
with measure() as big:
    block = np.ones(200 * 2**20 // 8)  # 200 MB
    time.sleep(0.3)  # several sampling intervals
    del block
print(json.dumps({"small": small, "big": big}))
"""


def test_measure_reports_wall_time_and_peak_memory():
    # A fresh process: in a long test session freed pages stay resident and are reused, so a
    # new 200 MB block need not raise the resident set at all.
    done = subprocess.run([sys.executable, "-c", _MEASURE_SCRIPT], capture_output=True, text=True,
                          check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    small, big = result["small"], result["big"]
    assert big["peak_rss_mb"] >= small["peak_rss_mb"] + 150
    assert big["wall_s"] > 0


def test_a_report_that_fails_the_browser_check_fails_the_run(tmp_path, monkeypatch, capsys):
    from lens_position.report import html as report_module

    def broken(path, screenshot=None):
        return report_module.BrowserCheck(figures_expected=1, figures_drawn=0, undrawn=["probe"],
                                          js_errors=["Uncaught TypeError: x is undefined"], screenshot=None)

    monkeypatch.setattr(report_module, "check_in_browser", broken)
    out = tmp_path / "out"
    status = main(["reproduce", "--quick", "--models", "tiny-llama", "--out", str(out), "--no-progress"])
    assert status == 1
    assert "failed its browser check" in capsys.readouterr().err
    assert _provenance(out)["browser_check"]["ok"] is False  # the record is written all the same


def test_without_chromium_the_browser_check_is_skipped_and_recorded(tmp_path, monkeypatch):
    from lens_position.ground.errors import MissingPackageError
    from lens_position.report import html as report_module

    def no_chromium():
        raise MissingPackageError("no Chromium found")

    monkeypatch.setattr(report_module, "find_chromium", no_chromium)
    out = tmp_path / "out"
    assert main(["probe", "tiny-llama", "--quick", "--browser-check", "--out", str(out), "--no-progress"]) == 0
    assert _provenance(out)["browser_check"] == {"ok": None, "skipped": "no Chromium found"}
    assert not (out / "report.png").exists()


def test_a_resumed_run_still_reports_what_each_step_cost(quick_run):
    prov = _provenance(quick_run)  # written by the all-cached rerun above when run in file order
    steps = [s for s in prov["steps"] if s["step"] != "load"]
    for step in steps:
        cost = step["provenance"]["computed_cost"]
        # a step fed by a forward pass an earlier step made (pipeline.passes) may use less CPU
        # than the process clock resolves, so its CPU time can read 0
        assert cost["wall_s"] > 0 and cost["cpu_s"] >= 0 and cost["peak_rss_mb"] > 0
    assert prov["steps_computed_wall_s"] == pytest.approx(sum(s["provenance"]["computed_cost"]["wall_s"]
                                                              for s in steps), abs=1e-2)


def test_prompt_sets_are_opt_in_and_reported_beside_the_claims(tmp_path):
    from lens_position.analyses.prompt_sets import SET_COLUMNS, SUMMARY_COLUMNS
    from lens_position.core.columns import display_order
    from lens_position.pipeline.steps import commands

    assert "prompt_sets" not in commands()["reproduce"] and "prompt_sets" not in commands()["decompose"]
    out = tmp_path / "sets"
    assert main(["decompose", "tiny-llama", "--quick", "--format", "csv", "--prompt-sets", "3", "--out", str(out),
                 "--no-progress"]) == 0
    sets, summary = pd.read_csv(out / "prompt_sets.csv"), pd.read_csv(out / "prompt_sets_summary.csv")
    # the columns in the display order of every table (lens_position.core.columns.display_order)
    assert list(sets.columns) == ["architecture", "role", "model", *display_order(SET_COLUMNS)]
    assert sorted(sets["set"].unique()) == [1, 2, 3]
    # a written table with intervals says how they were made (lens_position.core.intervals.annotate_intervals)
    assert list(summary.columns) == ["architecture", "role", "model", *display_order(SUMMARY_COLUMNS),
                                     "interval_method", "outside_interval"]
    assert set(summary["interval_method"]) == {"percentile"}
    assert summary["quantity"].tolist() == ["total_heldout", "R_rf_heldout", "M_rf_heldout"]
    assert (summary["n_sets"] == 3).all() and (summary["bootstrap_sd"] > 0).all()
    report = (out / "report.html").read_text()
    assert 'id="prompt-sets"' in report and "Across independent prompt sets" in report
    prov = _provenance(out)
    step = next(s for s in prov["steps"] if s["step"] == "prompt_sets")
    assert step["provenance"]["intervals"]["n_resamples"] > 0
    # a sub-command that measures neither C1 nor C2 has no --prompt-sets: a usage error
    with pytest.raises(SystemExit) as refused:
        main(["probe", "tiny-llama", "--quick", "--prompt-sets", "3", "--out", str(tmp_path / "p"), "--no-progress"])
    assert refused.value.code == 2


def test_analyze_and_the_reproduction_print_the_same_numbers(quick_run):
    """One question, one number: analyze on the reproduction's prompts (same model, N, T, seed, BOS
    policy and sizes as --quick) gives the reproduction's decomposition, sink heads, BOS replacement
    and C4's mean over replacements, to float precision, and says which prompts and queries C4 rests on."""
    import lens_position as lp
    from lens_position.core.intervals import Bootstrap
    from lens_position.pipeline.config import QUICK

    model = lp.load_model("tiny-llama")
    prompts = lp.build_prompts(model, T=QUICK.T, N=QUICK.N, bos="force", seed=0)
    result = lp.analyze(model, prompts, early_queries=QUICK.query_range[1], sink_length=QUICK.sink_T,
                        bootstrap=Bootstrap(n_resamples=QUICK.n_resamples), progress=False)
    arch = "standard RoPE: tiny-llama"

    def ours(name, keys):
        frame = pd.read_parquet(quick_run / f"{name}.parquet")
        return frame[frame["architecture"] == arch].sort_values(keys).reset_index(drop=True)

    for name, mine, keys in (("decompose_layers", result.layers, ["layer"]), ("sink_heads", result.sinks,
                             ["layer", "head"]), ("bos_overall", result.bos, ["replacement"]),
                             ("bos_layers", result.bos_layers, ["replacement", "layer"])):
        theirs, mine = ours(name, keys), mine.sort_values(keys).reset_index(drop=True)
        numeric = [c for c in mine.columns if c in theirs.columns and pd.api.types.is_numeric_dtype(mine[c])]
        assert len(numeric) > 3, name
        for column in numeric:
            np.testing.assert_allclose(mine[column].to_numpy(float), theirs[column].to_numpy(float), rtol=1e-9,
                                       atol=1e-12, equal_nan=True, err_msg=f"{name}.{column}")
    claims = pd.read_csv(quick_run / "claims.csv")
    c4 = claims[(claims["claim"] == "C4") & (claims["architecture"] == arch)].iloc[0]
    mean, = [h for h in result.headline() if "C4" in h.label]
    np.testing.assert_allclose([mean.estimate.value, mean.estimate.lo, mean.estimate.hi],
                               [c4["value"], c4["value_lo"], c4["value_hi"]], rtol=1e-9, equal_nan=True)
    text = " ".join(repr(result).split())
    assert "C4: mean" in text and f"queries 0–{QUICK.query_range[1] - 1} of {QUICK.N} prompts" in text
    assert f"over the first {QUICK.sink_T} positions" in text


def test_the_report_prints_no_percentage_past_300_or_with_four_digits(quick_run):
    """A ratio whose replicates' denominators come near 0 prints as "< -300%", a share below display
    resolution as "< 0.01%": the report of the tiny models holds no four-digit or unbounded percentage."""
    import html as html_module

    text = html_module.unescape(re.sub(r"<script.*?</script>|<[^>]+>", " ",
                                       (quick_run / "report.html").read_text(), flags=re.S))
    text += (quick_run / "claims.csv").read_text()
    printed = [float(x) for x in re.findall(r"(?<![\w.])([+-]?\d+(?:\.\d+)?(?:e[+-]?\d+)?)%", text)]
    assert printed, "the report prints percentages"
    assert all(abs(x) <= 300 for x in printed), sorted(printed, key=abs)[-5:]
    assert not re.search(r"\d{4,}(\.\d+)?%|e-?\d+%", text)


def test_a_reproduction_evaluates_its_claims_and_c3_by_length_once(tmp_path, monkeypatch):
    """The findings are computed once per run: claims.csv, the report's claims table, its C3-by-length
    section and the console summary all read the same values."""
    from lens_position.analyses import claims as claims_module
    from lens_position.findings import run as findings_run
    from lens_position.report import takeaways

    calls = {"evaluate": 0, "c3_by_length": 0}

    def counted(name, function):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)
        return wrapper

    evaluate, by_length = counted("evaluate", claims_module.evaluate), counted("c3_by_length",
                                                                               claims_module.c3_by_length)
    for module in (claims_module, takeaways):
        monkeypatch.setattr(module, "evaluate", evaluate)
    for module in (claims_module, findings_run):
        monkeypatch.setattr(module, "c3_by_length", by_length)
    out = tmp_path / "results"
    assert main(["reproduce", "--quick", "--models", "tiny-llama,tiny-llama@ntk_alpha=8", "--out", str(out),
                 "--no-progress", "--no-browser-check"]) == 0
    assert calls == {"evaluate": 1, "c3_by_length": 1}
    claims = pd.read_csv(out / "claims.csv")
    html = (out / "report.html").read_text()
    for row in claims[claims["architecture"] == "overall"].itertuples():
        assert escape(row.measured) in html  # the report renders the written table
