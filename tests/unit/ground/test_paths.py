"""The empty path is not the current folder: every door that takes a path (from Python and on the
command line) refuses an empty or blank one with the package's error, and reads or writes nothing
in the folder it runs in. Hypothesis draws the blank strings (spaces, tabs, newlines, in any mix)."""

from __future__ import annotations

import os
from pathlib import Path

import plotly.graph_objects as go
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lens_position.cli import commands as cli
from lens_position.core.results import load_result
from lens_position.ground.errors import BadInputError
from lens_position.ground.paths import checked_path
from lens_position.models.cache import CACHE_ENV, default_cache_dir
from lens_position.models.corpus import read_corpus
from lens_position.models.load import load_model
from lens_position.pipeline.config import DataOptions
from lens_position.pipeline.outputs import OutputFolder
from lens_position.pipeline.sweep import read_spec
from lens_position.report.html import check_in_browser, write_report
from lens_position.report.plots import save_figure

pytestmark = pytest.mark.tl4  # nothing here loads a model: the doors refuse first, on either TransformerLens

BLANK = st.text(alphabet=" \t\n\r\x0b\x0c", max_size=4)
SETTINGS = settings(max_examples=15, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


DOORS = {
    "read_corpus": lambda path: read_corpus(path),
    "DataOptions(corpus=)": lambda path: DataOptions(corpus=path),
    "load_model(name)": lambda path: load_model(path),
    "load_model(cache_dir=)": lambda path: load_model("tiny-llama", cache_dir=path),
    "OutputFolder": lambda path: OutputFolder(path, {"report.html"}),
    "load_result": lambda path: load_result(path),
    "read_spec": lambda path: read_spec(path),
    "save_figure": lambda path: save_figure(go.Figure(), path, "html"),
    "write_report": lambda path: write_report(path, {}),
    "check_in_browser": lambda path: check_in_browser(path),
}


@pytest.fixture
def a_folder_with_text(tmp_path, monkeypatch):
    """The current folder holds a text file and a sweep spec: a door that took '' for '.' would read them."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("my own notes, not a corpus")
    (tmp_path / "result.json").write_text("{}")
    return tmp_path


@pytest.mark.fault(area="paths", given="an empty or blank path ('', '  ', '\\t') for a corpus, model, cache folder, "
                   "output folder, saved result, sweep spec, figure or report, from Python",
                   happens="BadInputError 'the empty path ..., which would be the current folder', before anything "
                           "is read or written (build_prompts(corpus='') read every .txt under the current folder, "
                           "load_model(..., cache_dir='') accepted it)")
@pytest.mark.parametrize("door", sorted(DOORS))
@SETTINGS
@given(blank=BLANK)
def test_every_door_refuses_the_empty_path_and_leaves_the_folder_alone(a_folder_with_text, door, blank):
    before = sorted(os.listdir(a_folder_with_text))
    with pytest.raises(BadInputError, match="empty path"):
        DOORS[door](blank)
    assert sorted(os.listdir(a_folder_with_text)) == before


@pytest.mark.fault(area="paths", given="a path that holds a NUL byte, or is not a path at all (bytes, a number)",
                   happens="BadInputError naming the argument, not a ValueError or TypeError from the OS layer")
@pytest.mark.parametrize("value", ["out\x00put", b"out", 3, None])
def test_a_nul_byte_or_a_non_path_is_refused(value):
    with pytest.raises(BadInputError, match="corpus"):
        checked_path(value, "corpus")


@pytest.mark.fault(area="paths", given="$LENS_POSITION_CACHE set to spaces",
                   happens="BadInputError naming the variable (it was a folder named by the spaces, in the current "
                           "folder); set to '' it means unset")
def test_a_blank_cache_variable_is_refused_and_an_empty_one_is_unset(monkeypatch):
    monkeypatch.setenv(CACHE_ENV, "   ")
    with pytest.raises(BadInputError, match=CACHE_ENV):
        default_cache_dir()
    monkeypatch.setenv(CACHE_ENV, "")
    assert default_cache_dir() == Path.home() / ".cache" / "lens_position"


@pytest.mark.fault(area="paths", given="HOME empty, relative or / (cron, a service unit), no $LENS_POSITION_CACHE",
                   happens="the weight cache goes to $XDG_CACHE_HOME/lens_position when absolute, else BadInputError "
                           "naming LENS_POSITION_CACHE (it was put at /.cache or in the current folder)")
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(home=st.sampled_from(["", "/", "relative/home", "."]),
       xdg=st.sampled_from([None, "", "relative", "/var/cache/the-user"]))
def test_without_a_home_folder_the_cache_is_never_put_at_the_root_or_here(monkeypatch, home, xdg):
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setenv("HOME", home)
    if xdg is None:
        monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_CACHE_HOME", xdg)
    if xdg == "/var/cache/the-user":
        assert default_cache_dir() == Path("/var/cache/the-user/lens_position")
    else:
        with pytest.raises(BadInputError, match=CACHE_ENV):
            default_cache_dir()
    monkeypatch.setenv("HOME", "/home/someone")
    assert default_cache_dir() == Path("/home/someone/.cache/lens_position")


def test_an_explicit_current_folder_is_still_a_path(a_folder_with_text):
    """'.' is the user's own choice, not an accident: it is read like any folder."""
    corpus = read_corpus(".")
    assert corpus.documents == ("my own notes, not a corpus",)


CLI = {
    "--text": lambda blank, tmp: ["decompose", "tiny-llama", "--quick", "--text", blank, "--out", str(tmp / "o")],
    "--out": lambda blank, tmp: ["decompose", "tiny-llama", "--quick", "--out", blank],
    "MODEL": lambda blank, tmp: ["decompose", blank, "--quick", "--out", str(tmp / "o")],
    "sweep SPEC": lambda blank, tmp: ["sweep", blank, "--out", str(tmp / "o")],
    "sweep --out": lambda blank, tmp: ["sweep", str(tmp / "spec.toml"), "--out", blank],
    "zoo list --root": lambda blank, tmp: ["zoo", "list", "--root", blank],
    "zoo sink-sweep --out": lambda blank, tmp: ["zoo", "sink-sweep", "--out", blank],
}


@pytest.mark.fault(area="paths", given="lens-position ... --text '' (or an empty MODEL, sweep SPEC, --out, zoo --root)",
                   happens="a usage error (exit 2) or the package's error (exit 1) saying the path is empty; the run "
                           "does not start (--text '' used to analyse every .txt file under the current folder)")
@pytest.mark.parametrize("option", sorted(CLI))
@pytest.mark.parametrize("blank", ["", "  "])
def test_the_command_line_refuses_every_empty_path(a_folder_with_text, capsys, option, blank):
    before = sorted(os.listdir(a_folder_with_text))
    try:
        status = cli.main(CLI[option](blank, a_folder_with_text))
    except SystemExit as stop:
        status = stop.code
    err = capsys.readouterr().err
    assert status in (cli.EXIT_USAGE, cli.EXIT_ERROR), err
    assert "empty path" in err or "no model name" in err or "unknown model" in err, err
    assert sorted(os.listdir(a_folder_with_text)) == before
