"""Progress bars: one labelled bar per slow call, counting sequences, never nested.

Under pytest ``sys.stderr`` is not a terminal, so every bar here takes its non-TTY form:
plain lines, one when the work ends (and one every ``LINE_INTERVAL_S`` while it runs). The
tests read those lines: no carriage return or cursor movement may appear, each public slow
function writes exactly one line with its own label, and the count is the sequences its
forward passes ran.
"""

from __future__ import annotations

import re

import pytest
import torch

from lens_position.analyses import (
    bos,
    compare,
    decompose,
    fingerprint,
    patching,
    probes,
    prompt_sets,
    sinks,
    trajectory,
)
from lens_position.cli.commands import main
from lens_position.core.inputs import checked_prompts
from lens_position.ground import progress
from lens_position.models.tiny import VOCAB_SIZE

N, T = 4, 12
CONTROL = re.compile(r"[\r\x1b]")  # carriage-return redraws and escape sequences (cursor movement)
FINAL = re.compile(r"^(?P<label>.+?): (?P<n>\d+)/(?P<total>\d+) seq in \d")


@pytest.fixture(autouse=True)
def bars_on(monkeypatch):
    monkeypatch.delenv("TQDM_DISABLE", raising=False)


def _tokens(model, n=N, t=T, seed=0):
    tokens = torch.randint(3, VOCAB_SIZE, (n, t), generator=torch.Generator().manual_seed(seed))
    tokens[:, 0] = model.spec.bos_token_id
    return tokens


def _lines(err: str) -> list[str]:
    assert not CONTROL.search(err), f"terminal control codes in non-TTY output: {err!r}"
    return [line for line in err.splitlines() if line.strip()]


def _one_bar(capsys, label: str) -> int:
    """The one progress line a call wrote: its label, and the sequences it counted (all done)."""
    lines = _lines(capsys.readouterr().err)
    assert len(lines) == 1, lines
    match = FINAL.match(lines[0])
    assert match, lines[0]
    assert match["label"] == label
    assert match["n"] == match["total"]
    return int(match["n"])


# Every public slow function, called on N prompts of tiny-llama: (label, sequences counted).
CALLS = {
    "decompose": (lambda m, p: decompose.decompose(m, p), "decompose", N),
    "position_probe": (lambda m, p: probes.position_probe(m, p, ridge=1.0), "position probe", N),
    "sink_heads": (lambda m, p: sinks.sink_heads(m, p), "sink heads", N),
    "sink_scores": (lambda m, p: sinks.sink_scores(m, checked_prompts(m, p)), "sink scores", N),
    # base + three replacements
    "bos_replacement": (lambda m, p: bos.bos_replacement(m, p), "bos replacement", 4 * N),
    "decompose_conditions": (lambda m, p: compare.decompose_conditions(
        m, p, {"a": [], "b": [patching.head_ablation(m, [(0, 0)], "zero")[0]]}), "decompose conditions", 2 * N),
    # base, the patched run, zero and mean ablation
    "sink_reading_heads": (lambda m, p: sinks.sink_reading_heads(m, p), "sink-reading heads", 4 * N),
    "head_ablation_effect": (lambda m, p: sinks.head_ablation_effect(
        m, checked_prompts(m, p), [(0, 0)], base=decompose.decompose(m, p, progress=False), reference=p,
        query_range=(0, T)),
        "head ablation", 2 * N),
    # per patch layer a pattern-change run and a decomposition, and the base decomposition
    "trajectory_patching": (lambda m, p: trajectory.trajectory_patching(m, p, layers=[1, 2]),
                            "trajectory patching", 5 * N),
    "run_patches": (lambda m, p: patching.run_patches(m, p, [[], []], lambda logits: logits[:, -1, 0]),
                    "patching", 2 * N),
    # 3 layers x 2 positions, and the unpatched target run (the sweep's baseline)
    "resid_pre_sweep": (lambda m, p: patching.resid_pre_sweep(m, p, p.flip(0), lambda logits: logits[:, -1, 0].mean(),
                                                             positions=[1, 2]), "resid_pre sweep", 7 * N),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_every_slow_function_shows_one_labelled_bar_counting_sequences(tiny_llama, capsys, name):
    call, label, sequences = CALLS[name]
    tokens = _tokens(tiny_llama)
    capsys.readouterr()
    call(tiny_llama, tokens)
    assert _one_bar(capsys, label) == sequences


def test_sink_rate_fingerprint_and_prompt_sets_count_the_sequences_of_every_condition(tiny_llama, capsys):
    capsys.readouterr()
    sinks.sink_rate(tiny_llama, T=T, N=N)  # natural, random, repeated, repeated_bos
    assert _one_bar(capsys, "sink rate") == len(sinks.SINK_CONDITIONS) * N == 4 * N
    fingerprint.fingerprint(tiny_llama, T=T, N=N)  # auto-bos and varying-token0
    assert _one_bar(capsys, "fingerprint") == 2 * N
    prompt_sets.across_prompt_sets(tiny_llama, 3, T=T, N=N, source="random")  # one decomposition per set
    assert _one_bar(capsys, "prompt sets") == 3 * N


def test_progress_false_shows_nothing_also_from_the_calls_inside(tiny_llama, capsys):
    tokens = _tokens(tiny_llama)
    capsys.readouterr()
    bos.bos_replacement(tiny_llama, tokens, progress=False)  # its decompositions default to progress=True
    sinks.sink_reading_heads(tiny_llama, tokens, progress=False)
    trajectory.trajectory_patching(tiny_llama, tokens, layers=[1], progress=False)
    assert capsys.readouterr().err == ""


def test_tqdm_disable_turns_every_bar_off(tiny_llama, capsys, monkeypatch):
    monkeypatch.setenv("TQDM_DISABLE", "1")
    capsys.readouterr()
    decompose.decompose(tiny_llama, _tokens(tiny_llama))
    assert capsys.readouterr().err == ""


def test_inner_calls_fold_into_the_outermost_bar(capsys):
    capsys.readouterr()
    with progress.progress("outer") as outer:
        with progress.progress("inner a", total=3) as inner:
            inner.update(3)
        with progress.progress("inner b", total=2) as inner:
            inner.update(2)
        with progress.progress("left out", total=5, enabled=False) as silent:
            silent.update(5)
        assert outer.shown
    assert _one_bar(capsys, "outer") == 5


def test_a_declared_total_is_not_counted_twice_by_the_calls_inside(capsys):
    capsys.readouterr()
    with progress.progress("declared", total=4):
        for _ in range(2):
            with progress.progress("pass", total=2) as inner:
                inner.update(2)
    lines = _lines(capsys.readouterr().err)
    assert lines and lines[0].startswith("declared: 4/4 seq in "), lines


def test_long_work_writes_plain_periodic_lines(capsys, monkeypatch):
    clock = iter(float(t) for t in range(0, 1000, 20))  # every call to the clock: 20 s later
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    capsys.readouterr()
    with progress.progress("slow", total=4) as bar:
        for _ in range(4):
            bar.update(1)
    lines = _lines(capsys.readouterr().err)
    assert len(lines) > 1  # progress lines while running, then the final one
    assert all(line.startswith("slow: ") for line in lines)
    assert re.match(r"^slow: \d/4 seq \(\d+%\), ", lines[0]), lines[0]
    assert lines[-1].startswith("slow: 4/4 seq in ")


def test_reproduce_in_a_log_writes_one_labelled_line_per_model_and_step(capsys, tmp_path):
    """A reproduction with its output piped to a file: no redraws or cursor movement, one line
    per (model, step) with its place in the run, and the passes of each step counted in it."""
    from lens_position.pipeline.steps import commands

    status = main(["reproduce", "--quick", "--models", "tiny-llama", "--out", str(tmp_path / "out"),
                   "--no-browser-check"])
    assert status == 0
    lines = _lines(capsys.readouterr().err)
    steps = list(commands()["reproduce"])
    assert steps[:4] == ["decompose", "length_sweep", "probe", "bos"] and "fingerprint" in steps
    for k, step in enumerate(steps, start=1):
        label = f"[{k}/{len(steps)}] tiny-llama / {step}: "
        assert sum(line.startswith(label) for line in lines) == 1, (label, lines)
    counted = {m["label"].split(" / ")[1]: int(m["n"]) for m in map(FINAL.match, lines) if m}
    n = 4  # --quick: N = early_N = 4
    assert counted["bos"] == 4 * n  # its base decomposition and three replacements
    assert counted["sink_rate"] == 4 * n  # natural, random, repeated, repeated_bos
    assert counted["length_sweep"] == 3 * n  # --quick: T = 16, 40 and 80


def test_a_notebook_keeps_the_finished_line_and_no_widget(tmp_path, monkeypatch):
    """In a Jupyter kernel the bar is one text output redrawn in place: the stored notebook
    holds the finished count, no widget (which would show a dead 0% bar without a kernel)."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import torch\n"
        "from lens_position.analyses.decompose import decompose\n"
        "from lens_position.models import load_model\n"
        "model = load_model('tiny-llama')\n"
        f"_ = decompose(model, torch.randint(3, 200, ({N}, {T}), generator=torch.Generator().manual_seed(0)))")])
    nbclient.NotebookClient(notebook, timeout=300, startup_timeout=180, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = notebook.cells[0].outputs
    stored = nbformat.writes(notebook)
    assert "application/vnd.jupyter.widget" not in stored
    texts = [o.get("data", {}).get("text/plain", "") for o in outputs if o.output_type == "display_data"]
    assert len(texts) == 1, outputs
    assert re.match(rf"^decompose: {N}/{N} seq in ", texts[0]), texts[0]


def test_a_call_stopped_by_an_error_says_so_in_its_last_line(capsys):
    capsys.readouterr()
    with pytest.raises(RuntimeError):
        with progress.progress("failing", total=4) as bar:
            bar.update(1)
            raise RuntimeError("boom")
    lines = _lines(capsys.readouterr().err)
    assert lines == [lines[0]] and lines[0].startswith("failing: 1/4 seq in ") and "stopped by an error" in lines[0]


def test_a_stage_that_runs_past_its_threshold_gets_a_line_and_the_end_gives_the_slow_ones(capsys):
    import time

    with progress.stages("loading x", shown_after=0.2):
        progress.stage("quick part")
        progress.stage("slow part")
        time.sleep(0.3)
        progress.stage("another quick part")
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "loading x: slow part"
    assert re.fullmatch(r"loading x: done in \d+\.\d s \(slow part 0\.\d s\)", lines[1])
    assert len(lines) == 2


def test_quick_stages_print_nothing_and_nested_stages_join_the_outer_ones(capsys):
    with progress.stages("loading x", shown_after=5.0):
        progress.stage("one")
        with progress.stages("inner"):
            progress.stage("two")
    progress.stage("outside any stages: nothing")
    assert capsys.readouterr().err == ""


def test_stages_are_silent_under_a_silenced_bar_and_with_tqdm_disable(capsys, monkeypatch):
    with progress.progress("outer", enabled=False), progress.stages("loading x", shown_after=0.0):
        progress.stage("slow part")
    monkeypatch.setenv("TQDM_DISABLE", "1")
    with progress.stages("loading y", shown_after=0.0):
        progress.stage("slow part")
    assert capsys.readouterr().err == ""


@pytest.mark.slow
def test_a_cold_load_names_each_of_its_stages(capsys, monkeypatch, tmp_path):
    """Every stage of a cold and a warm load of the default model, shown with a threshold of 0 s
    (each stage then gets its line), in the order it runs."""
    from lens_position.models.load import load_model

    monkeypatch.setattr(progress, "STAGE_SHOWN_AFTER_S", 0.0)
    load_model("smollm2-135m", cache_dir=str(tmp_path))
    cold = [line.removeprefix("loading smollm2-135m: ") for line in capsys.readouterr().err.splitlines()
            if line.startswith("loading smollm2-135m: ")]
    assert cold[:-1] == ["importing TransformerLens", "reading SmolLM2-135M-Instruct.Q4_1.gguf's metadata",
                         "building its tokenizer", "dequantising its tensors", "converting to TransformerLens's layout",
                         "checking the conversion against transformers", "writing the weight cache",
                         "building the HookedTransformer", "checking its hooks"]
    assert cold[-1].startswith("done in ") and "dequantising its tensors" in cold[-1]
    load_model("smollm2-135m", cache_dir=str(tmp_path))
    warm = [line for line in capsys.readouterr().err.splitlines() if line.startswith("loading smollm2-135m: ")]
    assert [line.removeprefix("loading smollm2-135m: ") for line in warm[:-1]] == [
        "importing TransformerLens", "reading the weight cache", "building the HookedTransformer", "checking its hooks"]


class _Terminal:
    """A stream that says it is a terminal, keeping what is written."""

    def __init__(self):
        self.text = ""

    def isatty(self):
        return True

    def write(self, text):
        self.text += text

    def flush(self):
        pass


@pytest.mark.parametrize("leave", [True, False])
def test_a_bar_that_does_not_leave_clears_its_terminal_line(leave):
    """A run's cells each have a bar: cleared at their end, the terminal keeps one screen."""
    terminal = _Terminal()
    with progress.progress("cell", total=3, stream=terminal, leave=leave) as bar:
        bar.update(3)
    assert terminal.text.count("\n") == (1 if leave else 0)
    assert ("3/3" in terminal.text.rsplit("\r", 1)[-1]) == leave  # what stays on screen
