"""No silent wrong answers from the reproduction: step-cache keys by content, --text reaching
every step, output folders written whole, and a step cache safe under concurrent writers.

Each test reproduces a defect of the earlier pipeline (it fails there) and checks the fix.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import time
from pathlib import Path

import pandas as pd
import pytest

from lens_position.cli.commands import main
from lens_position.ground.errors import BadInputError
from lens_position.pipeline.cache import StepCache, step_key
from lens_position.pipeline.outputs import load_tables

TEXT_A = ("The quick brown fox jumps over the lazy dog while the river runs to the sea. " * 8)
TEXT_B = ("Colourless green ideas sleep furiously under a sky of unanswered questions. " * 8)
SMALL = ["--quick", "--T", "12", "--N", "3", "--no-progress"]


def _manifest(out: Path) -> dict:
    return json.loads((out / "provenance.json").read_text())


def _steps(out: Path) -> dict[str, dict]:
    return {s["step"]: s for s in _manifest(out)["steps"] if s["step"] != "load"}


# --------------------------------------------------------------------------- item 1: keys by content


@pytest.mark.fault(area='step cache', given='a corpus file edited in place, then the same command into the same --out',
                   happens="the steps on that text are recomputed: the cache key holds the corpus contents' sha256, "
                           "not its path")
def test_an_edited_corpus_file_is_not_served_from_the_step_cache(tmp_path):
    corpus, out = tmp_path / "corpus.txt", tmp_path / "out"
    corpus.write_text(TEXT_A)
    argv = ["decompose", "tiny-llama", "--text", str(corpus), "--out", str(out), *SMALL]
    assert main(argv) == 0
    first = pd.read_parquet(out / "decompose_layers.parquet")
    corpus.write_text(TEXT_B)  # same path, other contents
    assert main(argv) == 0
    step = _steps(out)["decompose"]
    assert step["cached"] is False
    assert step["provenance"]["data"]["corpus_sha256"] == hashlib.sha256(TEXT_B.encode()).hexdigest()
    assert not first.equals(pd.read_parquet(out / "decompose_layers.parquet"))


@pytest.mark.fault(area='step cache', given='a file added to a corpus folder, then the same command',
                   happens="recomputed (the key hashes the folder's text as read)")
def test_a_file_added_to_a_corpus_folder_is_not_served_from_the_step_cache(tmp_path):
    folder, out = tmp_path / "texts", tmp_path / "out"
    folder.mkdir()
    (folder / "a.txt").write_text(TEXT_A)
    argv = ["decompose", "tiny-llama", "--text", str(folder), "--out", str(out), *SMALL]
    assert main(argv) == 0
    (folder / "b.txt").write_text(TEXT_B)
    assert main(argv) == 0
    assert _steps(out)["decompose"]["cached"] is False


@pytest.mark.fault(area='step cache', given='the same relative --text path run from another folder',
                   happens='recomputed when the contents differ; served from the cache when they are the same')
def test_the_same_relative_corpus_path_in_another_folder_is_not_served_from_the_step_cache(tmp_path, monkeypatch):
    out = tmp_path / "out"
    for name, text in (("one", TEXT_A), ("two", TEXT_B)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "corpus.txt").write_text(text)
    argv = ["decompose", "tiny-llama", "--text", "corpus.txt", "--out", str(out), *SMALL]
    monkeypatch.chdir(tmp_path / "one")
    assert main(argv) == 0
    monkeypatch.chdir(tmp_path / "two")
    assert main(argv) == 0
    assert _steps(out)["decompose"]["cached"] is False
    # and the unchanged corpus is still served from the cache
    assert main(argv) == 0
    assert _steps(out)["decompose"]["cached"] is True


@pytest.mark.fault(area='step cache', given='another torch, transformers or transformer_lens version',
                   happens='every step is recomputed (the versions are part of each cache key)')
def test_step_keys_change_with_the_torch_transformers_and_transformer_lens_versions(monkeypatch):
    import importlib.metadata as md

    spec = {"name": "m", "weights_sha256": "a" * 64}
    config = {"data": {"seed": 0}, "sizes": {"T": 8}}
    before = step_key("decompose", spec, config)
    real = md.version
    for package in ("torch", "transformers", "transformer_lens"):
        monkeypatch.setattr(md, "version", lambda name, p=package: "0.0.0-other" if name == p else real(name))
        assert step_key("decompose", spec, config) != before, package
    monkeypatch.setattr(md, "version", real)
    assert step_key("decompose", spec, config) == before


# --------------------------------------------------------------------------- item 2: --text everywhere


@pytest.mark.fault(area='reproduction', given='--text with the fingerprint command',
                   happens="the fingerprint is measured on that text (its sha256 in the step's provenance)")
def test_text_reaches_the_fingerprint_step(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT_B)
    default, mine = tmp_path / "default", tmp_path / "mine"
    assert main(["fingerprint", "tiny-llama", "--out", str(default), *SMALL]) == 0
    assert main(["fingerprint", "tiny-llama", "--text", str(corpus), "--out", str(mine), *SMALL]) == 0
    data = _steps(mine)["fingerprint"]["provenance"]["data"]
    wanted = hashlib.sha256(TEXT_B.encode()).hexdigest()
    assert {c: d["corpus_sha256"] for c, d in data.items()} == {"auto-bos": wanted, "varying-token0": wanted}
    a, b = (pd.read_parquet(o / "fingerprint.parquet") for o in (default, mine))
    assert not a["norm"].equals(b["norm"])  # different text, different position-0 states without BOS


@pytest.mark.fault(area='reproduction', given='--text with the sinks command',
                   happens="sink_rate's natural condition is built from that text, like every other step")
def test_text_reaches_the_sink_rate_step(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT_B)
    out = tmp_path / "out"
    assert main(["sinks", "tiny-llama", "--text", str(corpus), "--out", str(out), *SMALL]) == 0
    data = _steps(out)["sink_rate"]["provenance"]["data"]
    assert data["natural"]["corpus_sha256"] == hashlib.sha256(TEXT_B.encode()).hexdigest()


# --------------------------------------------------------------------------- item 8: outputs whole


@pytest.mark.fault(area='outputs', given='a one-step command (or another --format) into a folder holding another run',
                   happens="the other run's tables and report files are removed; the manifest lists exactly this "
                           "run's files")
def test_a_one_step_command_into_a_reproduction_folder_leaves_no_other_runs_tables(tmp_path):
    out = tmp_path / "out"
    assert main(["sinks", "tiny-llama", "--out", str(out), *SMALL]) == 0
    assert (out / "sink_heads.parquet").is_file()
    assert main(["probe", "tiny-llama", "--format", "csv", "--out", str(out), *SMALL]) == 0
    manifest = _manifest(out)
    assert manifest["complete"] is True
    on_disk = {p.name for p in out.iterdir() if p.is_file()}
    assert on_disk == set(manifest["files"]) | {"provenance.json"}
    assert on_disk == {"probe_layers.csv", "claims.csv", "report.html", "provenance.json"}
    assert set(load_tables(out)) == {"probe_layers"}


@pytest.mark.fault(area='outputs', given='a run killed while it writes its outputs',
                   happens='provenance.json says complete: false; load_tables refuses the folder with BadInputError')
def test_a_run_killed_while_writing_leaves_a_folder_that_says_it_is_incomplete(tmp_path, monkeypatch):
    from lens_position.report import html as report

    out = tmp_path / "out"
    assert main(["probe", "tiny-llama", "--out", str(out), *SMALL]) == 0

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # the process is stopped while it writes the report

    monkeypatch.setattr(report, "build_report", killed)
    monkeypatch.setattr(report, "write_report", killed)
    main(["decompose", "tiny-llama", "--out", str(out), *SMALL])
    manifest = _manifest(out)
    assert manifest["complete"] is False  # never the probe run's provenance beside decompose's tables
    with pytest.raises(BadInputError, match="did not finish"):
        load_tables(out)


@pytest.mark.fault(area='outputs', given='a full disk while a table is written',
                   happens='the error is reported; the previous file stays whole and no temporary file is left')
def test_a_table_write_that_fails_midway_keeps_the_previous_file_whole(tmp_path, monkeypatch):
    out = tmp_path / "out"
    assert main(["probe", "tiny-llama", "--out", str(out), *SMALL]) == 0
    before = pd.read_parquet(out / "probe_layers.parquet")

    real = pd.DataFrame.to_parquet

    def disk_full(self, path, *args, **kwargs):  # the step cache has room, the output folder not
        if Path(path).parent.resolve() != out.resolve():
            return real(self, path, *args, **kwargs)
        Path(path).write_bytes(b"PAR1 half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", disk_full)
    assert main(["probe", "tiny-llama", "--seed", "1", "--out", str(out), *SMALL]) != 0
    monkeypatch.undo()
    pd.testing.assert_frame_equal(pd.read_parquet(out / "probe_layers.parquet"), before)
    assert not [p for p in out.iterdir() if p.name.startswith(".") and p.is_file()]  # no temporaries left


# --------------------------------------------------------------------------- item 9: cache races, leftovers


def _store_many(root: str, barrier, errors) -> None:
    frame = pd.DataFrame({"layer": list(range(50)), "R": [0.5] * 50})
    cache = StepCache(Path(root))
    barrier.wait()
    for _ in range(20):
        try:
            cache.store("decompose", "m", "k" * 64, {"decompose_layers": frame}, {"seed": 0})
        except Exception as error:  # noqa: BLE001 - any crash is the defect
            errors.put(f"{type(error).__name__}: {error}")


@pytest.mark.fault(area='step cache', given='several processes storing the same step-cache entry at once',
                   happens='no error; the first complete entry wins and stays readable')
def test_concurrent_writers_of_one_step_cache_entry_do_not_crash(tmp_path):
    ctx = multiprocessing.get_context("fork")
    barrier, errors = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_store_many, args=(str(tmp_path), barrier, errors)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    crashes = []
    while not errors.empty():
        crashes.append(errors.get())
    assert crashes == []
    tables, prov = StepCache(tmp_path).load("decompose", "m", "k" * 64)
    assert len(tables["decompose_layers"]) == 50 and prov == {"seed": 0}
    assert not [p for p in (tmp_path / "decompose").iterdir() if p.name.startswith(".")]


@pytest.mark.fault(area='step cache', given="a step-cache entry's temporary folder left by a killed writer",
                   happens='removed when a run opens the cache (if older than an hour; a younger one may be a live '
                           'writer and is kept)')
def test_a_killed_writers_leftover_is_removed_and_a_live_one_is_kept(tmp_path):
    out = tmp_path / "out"
    assert main(["probe", "tiny-llama", "--out", str(out), *SMALL]) == 0
    step_dir = out / "cache" / "probe"
    stale = step_dir / ".tiny-llama-0123456789abcdefghij-tmpdead"
    live = step_dir / ".tiny-llama-0123456789abcdefghij-tmplive"
    for folder in (stale, live):
        folder.mkdir()
        (folder / "probe_layers.parquet").write_bytes(b"x" * 1000)
    old = time.time() - 2 * 24 * 3600
    os.utime(stale, (old, old))
    assert main(["probe", "tiny-llama", "--out", str(out), *SMALL]) == 0
    assert not stale.exists()
    assert live.exists()  # possibly another process writing right now


def test_the_step_registry_names_every_table_the_report_reads_and_every_sub_command():
    from lens_position.cli.commands import build_parser
    from lens_position.pipeline.steps import STEPS, TABLES, commands, tables_of

    assert set(tables_of(tuple(STEPS))) == set(TABLES)
    subs = next(a for a in build_parser()._actions if a.dest == "command").choices
    assert set(commands()) <= set(subs)
    # every step but the opt-in ones, which their option adds (--prompt-sets)
    assert set(STEPS) - set(commands()["reproduce"]) == {"prompt_sets"}
    assert STEPS["prompt_sets"].opt_in == "--prompt-sets"
    options = {o for a in subs["reproduce"]._actions for o in a.option_strings}
    assert all(step.opt_in in options for step in STEPS.values() if step.opt_in is not None)


@pytest.mark.fault(area="step cache", given="a cached step result edited by hand (a table's R' multiplied by 10, "
                                            "or its provenance changed) in the output folder's cache",
                   happens="detected by the sha256 the entry recorded when written: recomputed with a warning, "
                           "the run's tables are the true ones")
@pytest.mark.parametrize("edit", ["table", "provenance", "hashes removed"])
def test_an_edited_step_cache_entry_is_recomputed(tmp_path, caplog, edit):
    out = tmp_path / "out"
    argv = ["decompose", "tiny-llama", "--out", str(out), *SMALL]
    assert main(argv) == 0
    truth = pd.read_parquet(out / "decompose_layers.parquet")
    (entry,) = (out / "cache" / "decompose").iterdir()
    record_path = entry / "provenance.json"
    record = json.loads(record_path.read_text())
    if edit == "table":
        table = pd.read_parquet(entry / "decompose_layers.parquet")
        table["R_rf_heldout"] *= 10
        table.to_parquet(entry / "decompose_layers.parquet", index=False)
    elif edit == "provenance":
        record["provenance"]["seed"] = 12345
        record_path.write_text(json.dumps(record))
    else:
        table = pd.read_parquet(entry / "decompose_layers.parquet")
        table["R_rf_heldout"] *= 10
        table.to_parquet(entry / "decompose_layers.parquet", index=False)
        record.pop("sha256")
        record_path.write_text(json.dumps(record))
    with caplog.at_level("WARNING"):
        assert main(argv) == 0
    assert "recomputing" in caplog.text
    assert _steps(out)["decompose"]["cached"] is False
    pd.testing.assert_frame_equal(pd.read_parquet(out / "decompose_layers.parquet"), truth)
    assert main(argv) == 0 and _steps(out)["decompose"]["cached"] is True
