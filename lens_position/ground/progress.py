"""Progress: one labelled bar per slow call, counting sequences (or conditions).

Every slow function of lens_position opens :func:`progress` around its work, and every
forward pass (:func:`lens_position.core.stream.stream`) opens one around its batches. Only the
*outermost* call shows anything; the calls it makes fold into its bar (their sequences are
added to its count), so ``bos_replacement`` shows one bar "bos replacement" counting the
sequences of its base and replaced passes, and ``lens-position reproduce`` shows one bar per
(model, step). ``progress=False`` on the outermost call silences everything under it; on an
inner call it leaves that call's work out of the outer count.

Where the bar goes depends on where it would be seen:

- a terminal (``stderr`` is a TTY): a ``tqdm`` bar, one at a time, never nested;
- a Jupyter kernel: one line of text redrawn in place (``display_id``), which ends as the
  final count: no widget, so a saved notebook shows the finished line, not a dead 0% bar;
- anything else (a CI log, ``| tee``, a file): plain lines, no carriage returns and no
  cursor movement: one every :data:`LINE_INTERVAL_S` seconds while the work runs, and one
  when it ends.

A piece of slow work made of different stages (a model's load) names them with :func:`stages`
and :func:`stage`: a line for each stage still running after a second, and one with their times.

``TQDM_DISABLE=1`` in the environment turns every bar off.
"""

from __future__ import annotations

import contextvars
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TextIO

#: Seconds between two plain progress lines (non-TTY output).
LINE_INTERVAL_S = 30.0
#: Seconds between two redraws of a notebook line.
NOTEBOOK_INTERVAL_S = 0.5


def progress_disabled_by_environment() -> bool:
    """Whether ``TQDM_DISABLE`` asks for no progress bars (tqdm's own switch)."""
    return os.environ.get("TQDM_DISABLE", "").strip().lower() not in ("", "0", "false", "no")


def _in_notebook() -> bool:
    """Whether this process is a Jupyter kernel whose output is shown by a notebook front end."""
    if "ipykernel" not in sys.modules:
        return False
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def output_kind(stream: TextIO | None = None) -> str:
    """Where a new bar would go: ``"notebook"``, ``"terminal"`` or ``"lines"``."""
    if _in_notebook():
        return "notebook"
    stream = sys.stderr if stream is None else stream
    try:
        return "terminal" if stream.isatty() else "lines"
    except (AttributeError, ValueError):  # a closed or minimal stream
        return "lines"


def _seconds(value: float) -> str:
    value = max(0.0, value)
    if value < 60:
        return f"{value:.1f} s"
    minutes, seconds = divmod(int(round(value)), 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


class Bar:
    """The one visible bar of an outermost :func:`progress` call. ``total`` may grow while
    the work runs (inner calls announce theirs as they start)."""

    def __init__(self, desc: str, unit: str, kind: str, stream: TextIO, total: int = 0, leave: bool = True):
        self.desc, self.unit, self.kind, self.stream = desc, unit, kind, stream
        self.n = 0
        self.total = int(total)
        self.postfix = ""
        self.started = time.perf_counter()
        self._last_draw = self.started
        self._tqdm: Any = None
        self._display: Any = None
        if kind == "terminal":
            from tqdm.std import tqdm

            self._tqdm = tqdm(total=self.total, desc=desc, unit=unit, file=stream, leave=leave)
        elif kind == "notebook":
            from IPython.display import display

            self._display = display({"text/plain": self._line()}, raw=True, display_id=True)

    # -- counting ---------------------------------------------------------------------

    def add(self, total: int) -> None:
        """Expect ``total`` more units of work."""
        self.total += int(total)
        if self._tqdm is not None:
            self._tqdm.total = self.total
            self._tqdm.refresh()

    def update(self, n: int) -> None:
        """``n`` more units done."""
        self.n += int(n)
        if self.n > self.total:  # more than announced: the count is the truth
            self.add(self.n - self.total)
        if self._tqdm is not None:
            self._tqdm.update(int(n))
        else:
            self._maybe_draw()

    def set_postfix(self, text: str) -> None:
        """A short note after the count (e.g. a training loss)."""
        self.postfix = text
        if self._tqdm is not None:
            self._tqdm.set_postfix_str(text, refresh=False)

    # -- drawing ----------------------------------------------------------------------

    def _line(self, *, final: bool = False) -> str:
        elapsed = time.perf_counter() - self.started
        note = f" [{self.postfix}]" if self.postfix else ""
        if final:
            if self.total == 0:
                return f"{self.desc}: done in {_seconds(elapsed)} (no pass of its own){note}"
            return f"{self.desc}: {self.n}/{self.total} {self.unit} in {_seconds(elapsed)}{note}"
        if self.total == 0:
            return f"{self.desc}: {_seconds(elapsed)}{note}"
        line = f"{self.desc}: {self.n}/{self.total} {self.unit} ({100 * self.n / self.total:.0f}%), {_seconds(elapsed)}"
        if 0 < self.n < self.total:
            line += f", ~{_seconds(elapsed * (self.total - self.n) / self.n)} left"
        return line + note

    def _maybe_draw(self) -> None:
        now = time.perf_counter()
        interval = NOTEBOOK_INTERVAL_S if self.kind == "notebook" else LINE_INTERVAL_S
        if now - self._last_draw < interval:
            return
        self._last_draw = now
        self._draw()

    def _draw(self, *, final: bool = False) -> None:
        if self.kind == "notebook":
            self._display.update({"text/plain": self._line(final=final)}, raw=True)
        elif self.kind == "lines":
            self.stream.write(self._line(final=final) + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()
        else:
            self._draw(final=True)


@dataclass
class _Scope:
    """One :func:`progress` call: the bar it counts into (None: silent), whether its own
    work is counted, and whether its total was announced (then inner calls add none)."""

    bar: Bar | None
    counted: bool
    declared: bool
    parent: _Scope | None

    def announced_above(self) -> bool:
        scope = self.parent
        while scope is not None:
            if scope.declared:
                return True
            scope = scope.parent
        return False


_ACTIVE: ContextVar[_Scope | None] = ContextVar("lens_position_progress", default=None)


class Progress:
    """What :func:`progress` yields: count work done with :meth:`update`."""

    def __init__(self, scope: _Scope):
        self._scope = scope

    @property
    def shown(self) -> bool:
        """Whether this call's work is counted in a visible bar."""
        return self._scope.counted

    def update(self, n: int = 1) -> None:
        if self._scope.counted and self._scope.bar is not None:
            self._scope.bar.update(n)

    def add(self, total: int) -> None:
        """Announce ``total`` more units (when the total was not known at the start)."""
        if self._scope.counted and self._scope.bar is not None and not self._scope.announced_above():
            self._scope.bar.add(total)

    def set_postfix(self, text: str) -> None:
        if self._scope.counted and self._scope.bar is not None and self._scope.parent is None:
            self._scope.bar.set_postfix(text)


@contextmanager
def progress(desc: str, *, total: int | None = None, unit: str = "seq", enabled: bool = True,
             stream: TextIO | None = None, leave: bool = True) -> Iterator[Progress]:
    """Count the work of one slow call (module docstring).

    ``desc``: the bar's label (used only when this call is the outermost). ``total``: the
    units of work it will do, when known at the start (inner calls then add nothing to the
    bar's total; they still count what they do); otherwise the total grows as inner calls
    announce theirs. ``unit``: what is counted, ``"seq"`` (sequences through the model) or a
    condition. ``enabled=False``: the outermost call shows nothing; an inner call's work is
    left out of the count. ``stream``: where a terminal bar or plain lines go (default
    ``sys.stderr`` as it is now). ``leave=False``: a terminal bar is cleared when it ends (one of
    many short bars, as a run's cells: the terminal keeps one screen); plain lines and notebook lines
    stay.
    """
    parent = _ACTIVE.get()
    if parent is None:
        bar = None
        if enabled and not progress_disabled_by_environment():
            out = sys.stderr if stream is None else stream
            bar = Bar(desc, unit, output_kind(out), out, total=total or 0, leave=leave)
        scope = _Scope(bar, counted=bar is not None, declared=total is not None, parent=None)
    else:
        scope = _Scope(parent.bar, counted=parent.counted and enabled, declared=total is not None, parent=parent)
        if total is not None and scope.counted and scope.bar is not None and not scope.announced_above():
            scope.bar.add(total)
    handle = Progress(scope)
    token = _ACTIVE.set(scope)
    try:
        yield handle
    except BaseException:
        if parent is None and scope.bar is not None:
            scope.bar.postfix = "stopped by an error"
        raise
    finally:
        _ACTIVE.reset(token)
        if parent is None and scope.bar is not None:
            scope.bar.close()


def note(text: str, *, enabled: bool = True, stream: TextIO | None = None) -> None:
    """One line of information before slow work starts (a run-time estimate), where the progress
    bars go: nothing with ``enabled=False``, ``TQDM_DISABLE``, or inside a call whose bar is silenced;
    above a terminal bar that is showing (``tqdm.write``), else a plain line."""
    scope = _ACTIVE.get()
    if not enabled or progress_disabled_by_environment() or (scope is not None and not scope.counted):
        return
    out = sys.stderr if stream is None else stream
    bar = scope.bar if scope is not None else None
    if bar is not None and bar._tqdm is not None:
        from tqdm.std import tqdm

        tqdm.write(text, file=bar.stream)
        return
    if bar is not None:
        out = bar.stream
    if output_kind(out) == "notebook":
        print(text)
        return
    out.write(text + "\n")
    out.flush()


__all__ = ["LINE_INTERVAL_S", "Progress", "note", "output_kind", "progress", "progress_disabled_by_environment"]


#: Seconds a stage of :func:`stages` runs before its line is shown.
STAGE_SHOWN_AFTER_S = 1.0


class _Stages:
    """The stages of one :func:`stages` call: the one running, when it began, whether its line was
    shown, and the seconds of every stage that ended."""

    def __init__(self, label: str, enabled: bool, stream: TextIO | None, shown_after: float):
        self.label, self.enabled, self.stream, self.shown_after = label, enabled, stream, shown_after
        self.started = time.perf_counter()
        self.current: tuple[str, float] | None = None
        self.timer: Any = None
        self.lock = threading.Lock()
        self.shown: set[str] = set()
        self.seconds: list[tuple[str, float]] = []

    def _show(self, text: str, context: Any) -> None:
        with self.lock:
            if text in self.shown or self.current is None or self.current[0] != text:
                return
            self.shown.add(text)
        context.run(note, f"{self.label}: {text}", enabled=self.enabled, stream=self.stream)

    def begin(self, text: str) -> None:
        self.end()
        self.current = (text, time.perf_counter())
        self.timer = threading.Timer(self.shown_after, self._show, args=(text, contextvars.copy_context()))
        self.timer.daemon = True
        self.timer.start()

    def end(self) -> None:
        if self.current is None:
            return
        self.timer.cancel()
        text, began = self.current
        elapsed = time.perf_counter() - began
        if elapsed >= self.shown_after:
            self._show(text, contextvars.copy_context())  # the timer may not have fired yet
        with self.lock:
            self.current = None
        self.seconds.append((text, elapsed))


_STAGES: ContextVar[_Stages | None] = ContextVar("lens_position_stages", default=None)


@contextmanager
def stages(label: str, *, enabled: bool = True, stream: TextIO | None = None,
           shown_after: float | None = None) -> Iterator[None]:
    """Name the stages of one slow piece of work (a model's load): inside the block, each
    :func:`stage` call begins a stage and ends the one before. A stage still running after
    ``shown_after`` seconds gets a line ``"<label>: <stage>"`` where progress goes (:func:`note`);
    when any stage was shown, the work ends with one line giving the total and every stage that
    took ``shown_after`` or more, in seconds. Work that is quick throughout prints nothing. Nested
    calls join the outermost one. ``shown_after`` defaults to :data:`STAGE_SHOWN_AFTER_S`."""
    if _STAGES.get() is not None:
        yield
        return
    shown_after = STAGE_SHOWN_AFTER_S if shown_after is None else shown_after
    run = _Stages(label, enabled, stream, shown_after)
    token = _STAGES.set(run)
    try:
        yield
    finally:
        run.end()
        _STAGES.reset(token)
        if run.shown:
            slow = ", ".join(f"{text} {_seconds(seconds)}" for text, seconds in run.seconds
                             if seconds >= shown_after)
            note(f"{label}: done in {_seconds(time.perf_counter() - run.started)} ({slow})", enabled=enabled,
                 stream=stream)


def stage(text: str) -> None:
    """Begin the stage ``text`` of the enclosing :func:`stages` call (nothing outside one)."""
    run = _STAGES.get()
    if run is not None:
        run.begin(text)
