"""What the machine refuses is a sentence naming the path and what to do, at every door: FIFOs and
devices are refused without blocking, JSON nested past what a parser takes is a damaged file, an
OS error at any write of a save is a ResourceError (never ``[Errno ...]``) and loses nothing."""

from __future__ import annotations

import errno
import json
import os
import pathlib
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lens_position.analyses.decompose import decompose
from lens_position.core.intervals import NO_INTERVALS
from lens_position.core.results import load_result
from lens_position.ground.errors import BadInputError, CorruptFileError, LensPositionError, ResourceError
from lens_position.ground.files import read_json, read_text, resource_error
from lens_position.models.corpus import read_corpus
from lens_position.models.toy import random_model, toy_tokens
from lens_position.pipeline.outputs import read_manifest
from lens_position.pipeline.sweep import read_spec

ROOT = Path(__file__).resolve().parents[3]
RESULT = decompose(random_model(n_layers=2, d_vocab=50), toy_tokens(3, 10, seed=0, d_vocab=50),
                   bootstrap=NO_INTERVALS, progress=False)


def finishes_within(seconds: float, function, *args):
    """Run ``function(*args)`` in a thread; fail if it blocks (a FIFO read waits forever)."""
    outcome: dict = {}

    def target():
        try:
            outcome["value"] = function(*args)
        except BaseException as error:  # noqa: BLE001 - handed back to the test
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{function.__name__} blocked on {args}"
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


@pytest.mark.fault(area="files", given="a FIFO (named pipe) where a result, a sweep spec, a corpus or a run's "
                                       "manifest is read",
                   happens="refused at once with a sentence naming it a FIFO; nothing waits forever")
def test_fifos_are_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(BadInputError, match="FIFO"):
        finishes_within(5, read_text, fifo, "sweep spec")
    with pytest.raises(BadInputError, match="FIFO"):
        finishes_within(5, read_spec, fifo)
    with pytest.raises(BadInputError, match="FIFO"):
        finishes_within(5, read_corpus, fifo)
    saved = RESULT.save(tmp_path / "result")
    (saved / "result.json").unlink()
    os.mkfifo(saved / "result.json")
    with pytest.raises(LensPositionError):
        finishes_within(5, load_result, saved)
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "provenance.json")
    assert finishes_within(5, read_manifest, run) is None


@pytest.mark.fault(area="files", given="a result manifest or sweep spec nested 100,000 levels deep",
                   happens="CorruptFileError / BadInputError naming the file; never a RecursionError")
def test_deeply_nested_files_are_damaged_files_not_crashes(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CorruptFileError, match="too deep"):
        read_json(deep, "manifest")
    saved = RESULT.save(tmp_path / "result")
    (saved / "result.json").write_text("{\"a\": " * 100_000 + "1" + "}" * 100_000)
    with pytest.raises(CorruptFileError, match="result.json"):
        load_result(saved)
    spec = tmp_path / "spec.toml"
    spec.write_text("a = " + "[" * 100_000 + "]" * 100_000)
    with pytest.raises(BadInputError, match="spec"):
        read_spec(spec)


ERRNOS = [errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EDQUOT, errno.EIO, errno.EMFILE, errno.ENOTDIR]
WRITES = [(os, "rename"), (pathlib.Path, "write_text"), (pathlib.Path, "mkdir"), (pd.DataFrame, "to_parquet")]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(code=st.sampled_from(ERRNOS), at=st.integers(0, 12))
def test_an_os_error_at_any_write_of_a_save_is_a_sentence_and_loses_nothing(tmp_path_factory, monkeypatch, code,
                                                                           at):
    """Property: whichever write of ``Result.save`` the OS refuses, and for whatever reason, the
    error is a ResourceError whose message names a path and has no ``[Errno``, and the result saved
    before still loads."""
    folder = tmp_path_factory.mktemp("save") / "run"
    RESULT.save(folder)
    count = [0]

    def failing(function):
        def wrapper(*args, **kwargs):
            if count[0] == at:
                count[0] += 1
                raise OSError(code, os.strerror(code), str(folder))
            count[0] += 1
            return function(*args, **kwargs)
        return wrapper

    with monkeypatch.context() as patch:
        for owner, name in WRITES:
            patch.setattr(owner, name, failing(getattr(owner, name)))
        try:
            RESULT.save(folder)
        except ResourceError as error:
            assert "[Errno" not in str(error) and str(folder) in str(error)
    assert load_result(folder).layers.equals(RESULT.layers)


def test_each_errno_reads_as_a_sentence_with_a_route():
    for code in ERRNOS + [errno.ENOENT, errno.EEXIST, errno.ENAMETOOLONG]:
        message = str(resource_error(OSError(code, os.strerror(code), "/x/y"), doing="saving the result"))
        assert "/x/y" in message and "[Errno" not in message and "; " in message, message
    assert "out of memory" in str(resource_error(MemoryError()))


def _tiny_checkpoint(folder: Path) -> Path:
    """tiny-qwen2 saved as a Hugging Face folder, with its tokenizer."""
    from lens_position.models.tiny import tiny_hf_model

    hf_model, tokenizer = tiny_hf_model("tiny-qwen2")
    hf_model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.fault(area="weight cache", given="LENS_POSITION_CACHE pointing at a file, or a read-only cache folder",
                   happens="the model loads without the cache, with a warning naming the folder and how to set one")
def test_an_unwritable_weight_cache_loads_the_model_with_a_warning(tmp_path, monkeypatch, caplog):
    from lens_position.models import load_model

    checkpoint = _tiny_checkpoint(tmp_path / "ckpt")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("LENS_POSITION_CACHE", str(blocker))
    with caplog.at_level("WARNING"):
        loaded = load_model(str(checkpoint))
    assert not loaded.spec.extra["from_cache"] and "LENS_POSITION_CACHE" in caplog.text and str(blocker) in caplog.text
    assert loaded.spec.weights_sha256 == load_model("tiny-qwen2").spec.weights_sha256


@pytest.mark.fault(area="weight cache", given="the weight cache's disk filling up while its weights are written",
                   happens="the model loads without the cache, with a warning naming the entry's folder")
def test_a_full_disk_while_writing_the_weight_cache_loads_the_model_with_a_warning(tmp_path, monkeypatch, caplog):
    from safetensors import SafetensorError

    from lens_position.models import cache, load_model

    checkpoint = _tiny_checkpoint(tmp_path / "ckpt")

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
                              "\"No space left on device\" }) (os error 28)")

    monkeypatch.setattr(cache, "save_file", full)
    monkeypatch.setenv("LENS_POSITION_CACHE", str(tmp_path / "cache"))
    with caplog.at_level("WARNING"):
        loaded = load_model(str(checkpoint))
    assert not loaded.spec.extra["from_cache"] and str(tmp_path / "cache") in caplog.text
    assert "internal error" not in caplog.text and not list((tmp_path / "cache").glob("*/meta.json"))


def cli(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lens_position.cli.commands", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


@pytest.mark.fault(area="command line", given="--out under a path whose parent is a file, a model path holding "
                                              "an @, zoo train --device cuda without CUDA",
                   happens="exit 1 with a sentence naming the path or device; never exit 3 or a raw [Errno]")
def test_command_line_faults_are_sentences(tmp_path):
    (tmp_path / "file").write_text("x")
    proc = cli("decompose", "tiny-llama", "--quick", "--no-progress", "--out", str(tmp_path / "file" / "out"),
               cwd=tmp_path)
    assert proc.returncode == 1 and "[Errno" not in proc.stderr and "file" in proc.stderr, proc.stderr
    proc = cli("zoo", "train", "rope", "--device", "cuda", "--root", str(tmp_path / "zoo"), cwd=tmp_path)
    assert proc.returncode == 1 and "no CUDA GPU" in proc.stderr, proc.stderr


def test_a_model_path_holding_an_at_sign_is_a_path(tmp_path):
    from lens_position.pipeline.models import parse_model_request

    folder = tmp_path / "v2@final"
    folder.mkdir()
    assert parse_model_request(str(folder)) == (str(folder), {})
    assert parse_model_request(f"{folder}@window=4") == (str(folder), {"window": 4})
    with pytest.raises(BadInputError, match="unknown load option 'ntk_alpa'"):
        parse_model_request("tiny-llama@ntk_alpa=8")


@pytest.mark.fault(area="zoo", given="a zoo checkpoint truncated, or its JSON damaged",
                   happens="CorruptFileError naming the file and the command that retrains it")
@pytest.mark.parametrize("damage", ["truncate", "json"])
def test_a_damaged_zoo_checkpoint_is_named(tmp_path, damage):
    from lens_position.models.zoo.store import SHIPPED, load_zoo_model

    root = tmp_path / "zoo"
    shutil.copytree(SHIPPED / "rope", root / "rope")
    weights, meta = root / "rope" / "seed0.safetensors", root / "rope" / "seed0.json"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:100])
    else:
        meta.write_text(json.dumps({"recipe": 1}))
    with pytest.raises(CorruptFileError, match="retrain|restore"):
        load_zoo_model("zoo:rope", root=root)


@pytest.mark.fault(area="output folder", given="--out naming a folder that holds only the user's own cache/ "
                                               "(hidden folders inside), with or without --force",
                   happens="refused (it is not lens_position's step cache); nothing in it is touched")
@pytest.mark.parametrize("force", [False, True])
def test_a_users_own_cache_folder_is_never_used_or_pruned(tmp_path, force):
    from lens_position.cli.commands import main

    out = tmp_path / "proj"
    hidden = out / "cache" / "notes" / ".git"
    hidden.mkdir(parents=True)
    os.utime(hidden, (0, 0))  # old enough to look like a killed writer's leftover
    (out / "cache" / "mine.txt").write_text("keep me")
    argv = ["decompose", "tiny-llama", "--quick", "--no-progress", "--T", "12", "--N", "4", "--out", str(out)]
    assert main(argv + (["--force"] if force else [])) == 1
    assert hidden.is_dir() and (out / "cache" / "mine.txt").read_text() == "keep me"


@pytest.mark.fault(area="sweeps", given="a sweep spec naming a model by a path relative to the spec's folder, run "
                                        "from another folder",
                   happens="the model is read from the spec's folder, as its text is")
def test_a_sweep_specs_relative_model_path_is_read_from_its_folder(tmp_path, monkeypatch):
    from lens_position.models.tiny import tiny_hf_model

    spec_dir = tmp_path / "study"
    hf_model, tokenizer = tiny_hf_model("tiny-llama")
    hf_model.save_pretrained(spec_dir / "models" / "mine")
    tokenizer.save_pretrained(spec_dir / "models" / "mine")
    (spec_dir / "corpus.txt").write_text("text " * 500)
    spec = spec_dir / "sweep.toml"
    spec.write_text('models = ["models/mine", "tiny-llama"]\ntext = "corpus.txt"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    checked = read_spec(spec)
    assert checked["models"] == [str((spec_dir / "models" / "mine").resolve()), "tiny-llama"]
    assert checked["text"] == str((spec_dir / "corpus.txt").resolve())
    spec.write_text('models = ["./missing"]\n')
    with pytest.raises(BadInputError, match="spec's folder"):
        read_spec(spec)


@pytest.mark.fault(area="models", given="a checkpoint folder that also holds a file this user cannot read",
                   happens="a file no loader reads counts by its name and size; an unreadable config or weight "
                           "file is a ResourceError naming it, with the route")
@pytest.mark.parametrize("unreadable, refused", [("notes.txt", False), ("config.json", True),
                                                 ("model.safetensors", True), ("merges.txt", True)])
def test_an_unreadable_file_in_a_checkpoint_folder_is_named_or_passed_over(tmp_path, monkeypatch, unreadable, refused):
    from lens_position.models import source_hash

    for name in ("config.json", "model.safetensors", "merges.txt", "notes.txt"):
        (tmp_path / name).write_bytes(name.encode())
    readable = source_hash.content_sha256(tmp_path)
    real_open = pathlib.Path.open

    def denied(self, *args, **kwargs):  # as root chmod does not deny a read: the refusal is simulated
        if self.name == unreadable:
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "open", denied)
    if refused:
        with pytest.raises(ResourceError, match=f"{unreadable} cannot be read.*chmod"):
            source_hash.content_sha256(tmp_path)
    else:
        hashed = source_hash.content_sha256(tmp_path)
        assert hashed != readable and hashed == source_hash.content_sha256(tmp_path)


@pytest.mark.fault(area="output folder", given="the disk filling up during a run, the OS error naming no file",
                   happens="exit 1 with one sentence naming the run's --out folder; never a raw [Errno]")
def test_a_full_disk_during_a_run_names_the_out_folder(tmp_path, monkeypatch, capsys):
    from lens_position.cli.commands import main
    from lens_position.pipeline import runner

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(runner, "run", full)
    out = tmp_path / "out"
    assert main(["fingerprint", "tiny-llama", "--out", str(out), "--quick"]) == 1
    error = capsys.readouterr().err
    assert "is full" in error and f"--out {out}" in error and "Errno" not in error
