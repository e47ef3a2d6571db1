"""Saves that never lose data: ``Result.save`` replaces an earlier result by renames only, never
deletes first, refuses a folder that holds the user's own files, and leaves the old or the new
result loadable (and no temporaries for long) whenever it is killed."""

from __future__ import annotations

import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lens_position.analyses.decompose import decompose
from lens_position.core import folder_swap
from lens_position.core.intervals import NO_INTERVALS
from lens_position.core.results import load_result
from lens_position.ground.errors import BadInputError
from lens_position.models.toy import random_model, toy_tokens

ROOT = Path(__file__).resolve().parents[3]


def two_results():
    """Two decompositions whose tables differ (other prompts), to tell the old save from the new."""
    loaded = random_model(n_layers=2, d_vocab=50)
    return [decompose(loaded, toy_tokens(3, 10, seed=seed, d_vocab=50), bootstrap=NO_INTERVALS, progress=False)
            for seed in (0, 1)]


OLD, NEW = two_results()


def which(folder: Path) -> str:
    """"old" or "new": the saved result now at ``folder`` (it must load)."""
    layers = load_result(folder).layers
    for name, result in (("old", OLD), ("new", NEW)):
        if layers.equals(result.layers):
            return name
    raise AssertionError("the folder holds neither result")


def temporaries(folder: Path) -> list[Path]:
    return sorted(folder.parent.glob(f".{folder.name}.*"))


@pytest.mark.fault(area="saved results", given="Result.save over a folder holding a saved result and the user's "
                                               "own notes or figures",
                   happens="refused (BadInputError naming the files); nothing is deleted, the old result loads")
def test_a_folder_with_the_users_own_files_is_never_replaced(tmp_path):
    folder = tmp_path / "run"
    OLD.save(folder)
    (folder / "notes.md").write_text("my notes")
    (folder / "figures").mkdir()
    with pytest.raises(BadInputError, match="figures, notes.md"):
        NEW.save(folder)
    assert (folder / "notes.md").read_text() == "my notes" and (folder / "figures").is_dir()
    assert which(folder) == "old" and not temporaries(folder)


def test_a_save_over_an_earlier_result_replaces_it_and_leaves_nothing_behind(tmp_path):
    folder = tmp_path / "run"
    (tmp_path / "mine.txt").write_text("beside it")
    OLD.save(folder)
    NEW.save(folder)
    assert which(folder) == "new" and not temporaries(folder)
    assert (tmp_path / "mine.txt").read_text() == "beside it"


# The file operations of a save, in order; a kill lands before any one of them.
OPERATIONS = [(os, "rename"), (shutil, "rmtree"), (pathlib.Path, "write_text"), (pathlib.Path, "mkdir"),
              (pd.DataFrame, "to_parquet")]


def save_killed_at(result, folder: Path, kill_at: int) -> int:
    """Fork; in the child, save ``result`` to ``folder`` and die (``os._exit``, as SIGKILL: no
    ``finally``, no cleanup) just before its ``kill_at``-th file operation. Returns the number of
    operations the save made (when it was not killed)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read)
        count = [0]

        def killing(function):
            def wrapper(*args, **kwargs):
                if count[0] == kill_at:
                    os._exit(9)
                count[0] += 1
                return function(*args, **kwargs)
            return wrapper

        for owner, name in OPERATIONS:
            setattr(owner, name, killing(getattr(owner, name)))
        try:
            result.save(folder)
        finally:
            os.write(write, str(count[0]).encode())
            os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    made = os.read(read, 64).decode()
    os.close(read)
    return int(made) if made else -1


@pytest.mark.fault(area="saved results", given="Result.save over an earlier result, killed before any one of its "
                                               "file operations (between removing the old and renaming the new "
                                               "included)",
                   happens="the old or the new result loads (the next load or save completes an interrupted swap), "
                           "the user's files beside it are untouched, no temporary folder outlives the next save")
def test_a_save_killed_before_any_operation_leaves_the_old_or_the_new_result(tmp_path):
    folder = tmp_path / "run"
    (tmp_path / "mine.txt").write_text("beside it")
    OLD.save(folder)
    n_operations = save_killed_at(NEW, tmp_path / "probe", kill_at=10**6)
    assert n_operations > 5
    seen = set()
    for kill_at in range(n_operations + 1):
        seen.add(which_after_kill(folder, kill_at))
        assert (tmp_path / "mine.txt").read_text() == "beside it"
    assert seen == {"old", "new"}  # kills before the swap keep the old result, after it the new


def which_after_kill(folder: Path, kill_at: int) -> str:
    OLD.save(folder)
    save_killed_at(NEW, folder, kill_at)
    found = which(folder)
    OLD.save(folder)  # the next save cleans what the killed one left
    assert not temporaries(folder), kill_at
    return found


@settings(max_examples=6, deadline=None)
@given(kills=st.lists(st.integers(0, 40), min_size=1, max_size=4))
def test_repeated_kills_at_random_points_never_lose_the_result(tmp_path_factory, kills):
    """Property: saves killed one after another at random points, then one that completes: a result
    loads after every kill, and the last complete save is what loads in the end."""
    folder = tmp_path_factory.mktemp("kills") / "run"
    OLD.save(folder)
    for kill_at in kills:
        save_killed_at(NEW if kill_at % 2 else OLD, folder, kill_at)
        assert which(folder) in ("old", "new")
    NEW.save(folder)
    assert which(folder) == "new" and not temporaries(folder)


SAVING_FOREVER = textwrap.dedent("""
    import sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[2])
    from test_safe_saves import NEW, OLD
    folder = Path(sys.argv[1])
    print("ready", flush=True)
    while True:
        for result in (NEW, OLD):
            result.save(folder)
""")


@pytest.mark.fault(area="saved results", given="a process saving results in a loop, killed by SIGKILL at random "
                                               "moments",
                   happens="a result loads after every kill, and the next save leaves no temporary folder")
def test_sigkill_at_random_moments_leaves_a_loadable_result(tmp_path):
    folder = tmp_path / "run"
    OLD.save(folder)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    rng = random.Random(0)
    for _ in range(3):
        child = subprocess.Popen([sys.executable, "-c", SAVING_FOREVER, str(folder), str(Path(__file__).parent)],
                                 stdout=subprocess.PIPE, env=env, cwd=tmp_path)
        assert child.stdout is not None and child.stdout.readline().strip() == b"ready"
        time.sleep(rng.uniform(0.05, 0.6))
        child.send_signal(signal.SIGKILL)
        child.wait()
        assert which(folder) in ("old", "new")
    NEW.save(folder)
    assert which(folder) == "new" and not temporaries(folder)


def test_a_live_writers_temporary_is_never_taken(tmp_path):
    """A temporary named by a running process (another save in progress) is left alone."""
    folder = tmp_path / "run"
    OLD.save(folder)
    live = folder.parent / f".{folder.name}.new-{os.getppid()}-abcdef12"
    live.mkdir()
    NEW.save(folder)
    assert live.is_dir()
    assert folder_swap.recover(folder, lambda path: True) is None and live.is_dir()


@pytest.mark.fault(area="saved results", given="Result.save through a symbolic link to an earlier result "
                                               "(result.save('latest'), latest -> runs/a), or a dangling one",
                   happens="written into the link's target, the link kept; nothing left beside either")
def test_a_save_through_a_link_writes_into_its_target_and_keeps_the_link(tmp_path):
    target = tmp_path / "runs" / "a"
    OLD.save(target)
    link = tmp_path / "latest"
    link.symlink_to(target, target_is_directory=True)
    assert NEW.save(link) == link
    assert link.is_symlink() and Path(os.path.realpath(link)) == target
    assert which(target) == which(link) == "new"
    assert not temporaries(target) and not temporaries(link)
    dangling = tmp_path / "next"
    dangling.symlink_to(tmp_path / "runs" / "b", target_is_directory=True)
    OLD.save(dangling)
    assert dangling.is_symlink() and which(tmp_path / "runs" / "b") == "old" and not temporaries(dangling)


@pytest.mark.fault(area="saved results", given="threads of one process saving to one path at once",
                   happens="every save lands whole (the last one stays); none fails, nothing is left behind")
@given(n_threads=st.integers(2, 6), saves=st.integers(1, 3), seed=st.integers(0, 2**16))
@settings(max_examples=12, deadline=None)
def test_threads_saving_to_one_path_each_land_whole(tmp_path_factory, n_threads, saves, seed):
    import threading

    folder = tmp_path_factory.mktemp("threads") / "run"
    OLD.save(folder)
    errors: list[BaseException] = []
    start = threading.Barrier(n_threads)
    rng = random.Random(seed)
    pauses = [[rng.random() * 0.002 for _ in range(saves)] for _ in range(n_threads)]

    def work(k: int) -> None:
        start.wait()
        for pause in pauses[k]:
            time.sleep(pause)
            try:
                (NEW if (k + len(pauses[k])) % 2 else OLD).save(folder)
            except BaseException as error:  # noqa: BLE001 - every failure is the test's to report
                errors.append(error)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(n_threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert which(folder) in ("old", "new") and not temporaries(folder)
