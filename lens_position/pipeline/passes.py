"""Shared forward passes: one pass per (model, prompt set, intervention) feeds every step.

Several steps of a reproduction read the same prompts through the same, un-intervened
model: the decomposition and the probe (same ``T`` and ``N``), BOS replacement and the
sink-reading detector (the same base decomposition), the sink heads, the natural-text sink
rate and the fingerprint (the same ``T = 64`` prompts). Each step states what it reads as
:class:`Request` values (a named reducer on a prompt set); before a model's steps run, the
worker hands every pending step's requests to :meth:`SharedPasses.expect`, and the first
step that asks for a result streams *all* reducers expected on that prompt set in one pass
(:func:`lens_position.core.stream.stream`). A step asked for without ``expect`` still works: it
then gets a pass of its own.

Prompt sets are matched by their tokens and by the batches they are cut into (a float32
forward pass may round differently with a different batch shape), so sharing never changes
a number.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from lens_position.core.data import PromptSet
from lens_position.core.stream import Reducer, stream
from lens_position.models.spec import LoadedModel


@dataclass(frozen=True)
class Request:
    """A step's need: the ``result()`` of the reducer ``make()`` builds, streamed over
    ``prompts`` in batches of ``batch_size``. ``what`` identifies the analysis and its options (a
    frozen dataclass; its ``str`` labels the pass): two requests for the same ``what`` on the same
    prompt set are the same result."""

    what: Hashable
    prompts: PromptSet | torch.Tensor
    make: Callable[[], Any]
    batch_size: int

    def key(self) -> tuple[str, int]:
        tokens = self.prompts.tokens if isinstance(self.prompts, PromptSet) else self.prompts
        digest = hashlib.sha256(tokens.cpu().numpy().tobytes() + str(tuple(tokens.shape)).encode()).hexdigest()
        return digest, min(self.batch_size, int(tokens.shape[0]))


class SharedPasses:
    """The results of the passes made for one model's steps (module docstring)."""

    def __init__(self, loaded: LoadedModel, *, progress: bool = False) -> None:
        self.loaded = loaded
        self.progress = progress
        self._expected: dict[tuple[str, int], dict[Hashable, Request]] = {}
        self._results: dict[tuple[tuple[str, int], Hashable], Any] = {}
        self.n_passes = 0

    def expect(self, requests: Iterable[Request]) -> None:
        """Announce what the steps still to run will ask for."""
        for request in requests:
            key = request.key()
            if (key, request.what) not in self._results:
                self._expected.setdefault(key, {}).setdefault(request.what, request)

    def get(self, request: Request) -> Any:
        """The result ``request`` asks for, streaming (once) every reducer expected on its
        prompt set."""
        key = request.key()
        if (key, request.what) not in self._results:
            wanted = self._expected.pop(key, {})
            wanted.setdefault(request.what, request)
            reducers: dict[Hashable, Reducer] = {what: expected.make() for what, expected in wanted.items()}
            stream.body(self.loaded, request.prompts, list(reducers.values()), batch_size=key[1],
                   progress=self.progress, desc=" + ".join(str(what) for what in reducers))
            self.n_passes += 1
            for what, reducer in reducers.items():
                self._results[(key, what)] = reducer.result()  # type: ignore[attr-defined]
        return self._results[(key, request.what)]
