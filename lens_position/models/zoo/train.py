"""Train one zoo model from its recipe: resumable, reproducible, CPU or GPU.

The loop, top to bottom: check the corpus hash against the recipe; resume from the
partial checkpoint if one with the same recipe hash exists; for every step draw the batch
from a generator seeded by ``(seed, step)`` (so a resumed run sees the very batches an
uninterrupted one would), take one AdamW step, and every ``eval_every`` steps measure the
held-out loss; every ``checkpoint_every`` steps save parameters, optimiser state and the
loss curve (atomically). At the context extension (``extend_at``) the model is rebuilt with
the new rotary base and the parameters and optimiser state carried over.

Same recipe, same seed, same machine (device, thread count, library versions) → the same
weights bit for bit: nothing here draws from a global RNG, and no nondeterministic kernel
is used (``torch.use_deterministic_algorithms`` on a GPU).

Losses are cross-entropy in **bits per byte** over every predicted position (each position
predicts the next byte; a BOS is never a target).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Int

from lens_position.ground.errors import BadInputError, CorruptFileError
from lens_position.ground.progress import progress as progress_bar
from lens_position.models.placement import check_device
from lens_position.models.zoo.architecture import build_model, load_parameters, parameters_of
from lens_position.models.zoo.corpus import TrainingSplit, evaluation_batch, sample_batch, train_subset, training_split
from lens_position.models.zoo.recipe import Recipe

LN2 = math.log(2.0)


@dataclass
class TrainResult:
    """A trained model's parameters and what training measured. ``curve``: one dict per
    evaluation (``step``, ``tokens``, ``train_bits`` = mean training loss since the previous
    evaluation, ``held_out_bits``, ``seconds``). ``tokens_per_second``: training positions
    per wall-clock second, evaluations and checkpoints included."""

    recipe: Recipe
    parameters: dict[str, torch.Tensor]
    curve: list[dict[str, float]]
    held_out_bits: float
    seconds: float
    tokens_per_second: float
    device: str
    resumed_from: int
    environment: dict[str, Any] = field(default_factory=dict)


def default_device() -> str:
    """``"cuda"`` when a GPU is present, else ``"cpu"``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def batch_generator(recipe: Recipe, step: int) -> torch.Generator:
    """The generator that draws the batch of ``step`` (depends on seed and step only)."""
    return torch.Generator().manual_seed(recipe.seed * 1_000_003 + step)


def next_byte_loss(model: HookedTransformer, tokens: Int[torch.Tensor, "batch pos"]) -> torch.Tensor:
    """Mean cross-entropy (nats) of predicting ``tokens[:, 1:]`` from the prefixes."""
    logits = model(tokens, return_type="logits")
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


@torch.no_grad()
def held_out_bits(model: HookedTransformer, recipe: Recipe, corpus: TrainingSplit, device: str) -> float:
    """Held-out loss (bits per byte) on ``n_eval_sequences`` evenly spaced windows of the
    held-out split at the full context."""
    tokens = evaluation_batch(corpus.held_out, n=recipe.n_eval_sequences, context=recipe.context,
                              bos=recipe.bos).to(device)
    total = 0.0
    for first in range(0, len(tokens), 16):
        chunk = tokens[first:first + 16]
        total += float(next_byte_loss(model, chunk)) * len(chunk)
    return total / len(tokens) / LN2


def _optimizer(model: HookedTransformer, recipe: Recipe) -> torch.optim.AdamW:
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for _, p in trainable if p.ndim >= 2], "weight_decay": recipe.weight_decay},
              {"params": [p for _, p in trainable if p.ndim < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=recipe.lr, betas=recipe.betas, eps=1e-8)


def _rebuild(model: HookedTransformer, optimizer: torch.optim.AdamW, recipe: Recipe, base: float,
             device: str) -> tuple[HookedTransformer, torch.optim.AdamW]:
    """The same parameters and optimiser state in a model with rotary base ``base``."""
    new_model = build_model(recipe, rotary_base=base, device=device, initialise=False)
    load_parameters(new_model, parameters_of(model))
    new_optimizer = _optimizer(new_model, recipe)
    new_optimizer.load_state_dict(optimizer.state_dict())
    return new_model, new_optimizer


def _save_partial(path: Path, model: HookedTransformer, optimizer: torch.optim.AdamW, step: int,
                  recipe: Recipe, curve: list[dict[str, float]], seconds: float) -> None:
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    torch.save({"recipe_sha256": recipe.sha256(), "step": step, "parameters": parameters_of(model),
                "optimizer": optimizer.state_dict(), "curve": curve, "seconds": seconds}, partial)
    partial.replace(path)


def read_resume(path: Path, device: str = "cpu") -> dict[str, Any]:
    """A resume file written by training, read with ``weights_only=True`` (tensors, numbers,
    strings and containers only: a planted pickle cannot run code). CorruptFileError naming the
    file if it cannot be read or lacks the fields a resume needs."""
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except Exception as error:  # pickle, zip and unpickler-refusal errors all mean: not ours
        raise CorruptFileError(f"{path} is not a readable resume file ({type(error).__name__}: {error}); "
                               "delete it to train from the start") from error
    needed = {"recipe_sha256", "step", "parameters", "optimizer", "curve", "seconds"}
    if not isinstance(state, dict) or not needed <= set(state):
        raise CorruptFileError(f"{path} is not a resume file of zoo training (missing "
                               f"{sorted(needed - set(state) if isinstance(state, dict) else needed)}); delete it")
    return state


def train(recipe: Recipe, *, work_dir: Path, device: str | None = None, progress: bool = True,
          corpus: TrainingSplit | None = None, stop_after: int | None = None, threads: int = 1,
          on_eval: Callable[[HookedTransformer], dict[str, Any]] | None = None) -> TrainResult:
    """Train ``recipe`` (resuming from ``work_dir/<variant>-seed<k>.resume.pt`` when it holds
    a checkpoint of the same recipe) and return the final parameters and measurements.

    ``stop_after``: stop after that many steps in total, leaving the resume checkpoint
    (simulates an interruption; the result is then incomplete and says so by its step).
    ``threads``: CPU threads for the run (default 1: on a shared 2-core machine two threads
    contend and run ~5x slower than one; the thread count is part of "same machine" for
    bit-identical weights). ``on_eval``: called with the model (in eval mode, under
    ``torch.no_grad``) at every evaluation; the fields it returns are added to that point of
    the loss curve (measurements along training, e.g. sink scores; they never touch the
    weights, the batches or any RNG the training draws from). Raises BadInputError when this
    interpreter's corpus is not the recipe's. On TransformerLens 4.x the model trained is a
    ``MiniTransformer`` (:func:`~lens_position.models.zoo.architecture.build_model`).
    """
    if device is not None:
        check_device(device)  # cuda on a machine without it: a sentence, before anything is built
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _train(recipe, work_dir=work_dir, device=device, progress=progress, corpus=corpus,
                      stop_after=stop_after, on_eval=on_eval)
    finally:
        torch.set_num_threads(previous_threads)


def _train(recipe: Recipe, *, work_dir: Path, device: str | None, progress: bool,
           corpus: TrainingSplit | None, stop_after: int | None,
           on_eval: Callable[[HookedTransformer], dict[str, Any]] | None) -> TrainResult:
    corpus = corpus or training_split()
    if corpus.sha256 != recipe.corpus_sha256:
        raise BadInputError(
            f"this Python's standard-library corpus has sha256 {corpus.sha256[:12]}, the recipe was "
            f"written for {recipe.corpus_sha256[:12]} (CPython 3.11.7); training here would not "
            "reproduce the recipe. Use that Python version, or make a recipe with "
            "dataclasses.replace(recipe, corpus_sha256=training_split().sha256)")
    train_text = train_subset(corpus.train, recipe.train_fraction)
    device = device or default_device()
    if device.startswith("cuda"):
        torch.use_deterministic_algorithms(True)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    work_dir.mkdir(parents=True, exist_ok=True)
    resume_path = work_dir / f"{recipe.variant}-seed{recipe.seed}.resume.pt"
    model, optimizer, start, curve, seconds_before = _start(recipe, resume_path, device)
    base = recipe.phase(start)[2]
    resumed_from = start

    end = recipe.steps if stop_after is None else min(recipe.steps, stop_after)
    started = time.perf_counter()
    running, running_n = 0.0, 0
    sequences = [recipe.phase(step)[0] for step in range(recipe.steps)]  # the batch of every step
    model.train()
    with progress_bar(f"train zoo:{recipe.variant} seed {recipe.seed}", total=sum(sequences[start:end]),
                      enabled=progress) as bar:
        for step in range(start, end):
            batch, context, step_base = recipe.phase(step)
            if step_base != base:
                model, optimizer = _rebuild(model, optimizer, recipe, step_base, device)
                base = step_base
            tokens = sample_batch(train_text, batch=batch, context=context, bos=recipe.bos,
                                  generator=batch_generator(recipe, step)).to(device)
            loss = _step(model, optimizer, recipe, tokens, step)
            running += float(loss.detach()) / LN2
            running_n += 1
            bar.update(batch)
            done = step + 1
            if done % recipe.eval_every == 0 or done == recipe.steps:
                model.eval()
                curve.append({"step": done, "tokens": done * recipe.batch * recipe.context,
                              "train_bits": running / running_n,
                              "held_out_bits": held_out_bits(model, recipe, corpus, device),
                              "seconds": seconds_before + time.perf_counter() - started})
                if on_eval is not None:
                    with torch.no_grad():
                        curve[-1].update(on_eval(model))
                model.train()
                running, running_n = 0.0, 0
                bar.set_postfix(f"train {curve[-1]['train_bits']:.3f}, held-out {curve[-1]['held_out_bits']:.3f} bits")
            elif done % 10 == 0:
                bar.set_postfix(f"loss {float(loss.detach()) / LN2:.3f} bits")
            if done % recipe.checkpoint_every == 0 and done < recipe.steps:
                _save_partial(resume_path, model, optimizer, done, recipe, curve,
                              seconds_before + time.perf_counter() - started)
    model.eval()
    seconds = seconds_before + time.perf_counter() - started
    if end < recipe.steps:
        _save_partial(resume_path, model, optimizer, end, recipe, curve, seconds)
    trained_tokens = (end - resumed_from) * recipe.batch * recipe.context
    result = TrainResult(
        recipe=recipe, parameters=parameters_of(model), curve=curve,
        held_out_bits=curve[-1]["held_out_bits"] if curve and end == recipe.steps else float("nan"),
        seconds=seconds, tokens_per_second=trained_tokens / max(time.perf_counter() - started, 1e-9),
        device=device, resumed_from=resumed_from,
        environment={"torch": torch.__version__, "threads": torch.get_num_threads(),
                     "load_average": _load_average(), "device_name": _device_name(device)})
    if end == recipe.steps and resume_path.exists():
        resume_path.unlink()
    return result


def _start(recipe: Recipe, resume_path: Path, device: str
           ) -> tuple[HookedTransformer, torch.optim.Optimizer, int, list[dict[str, Any]], float]:
    """The model and optimiser training starts from: a fresh initialisation, or the state a run of
    the same recipe saved (``resume_path``); with the step, the learning curve and the seconds so far."""
    if resume_path.is_file():
        state = read_resume(resume_path, device)
        if state["recipe_sha256"] == recipe.sha256():
            start = state["step"]
            model = build_model(recipe, rotary_base=recipe.phase(start)[2], device=device, initialise=False)
            load_parameters(model, state["parameters"])
            optimizer = _optimizer(model, recipe)
            optimizer.load_state_dict(state["optimizer"])
            return model, optimizer, start, state["curve"], state["seconds"]
    model = build_model(recipe, rotary_base=recipe.phase(0)[2], device=device)
    return model, _optimizer(model, recipe), 0, [], 0.0


def _step(model: HookedTransformer, optimizer: torch.optim.Optimizer, recipe: Recipe, tokens: torch.Tensor,
          step: int) -> torch.Tensor:
    """One optimiser step on ``tokens`` at the recipe's learning rate for ``step``; the loss (nats)."""
    for group in optimizer.param_groups:
        group["lr"] = recipe.lr_at(step)
    loss = next_byte_loss(model, tokens)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
    optimizer.step()
    return loss


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(device)
    import platform

    return platform.processor() or platform.machine()


