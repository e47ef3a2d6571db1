"""The zoo's recipe: one frozen dataclass per variant, equal in everything but position.

Every variant shares the sizes, optimiser, schedule, token budget and data; only the
fields of the *position* group differ (``position``, ``attn_types``, ``window``, ``bos``,
the context extension). A recipe is hashed (sha256 of its canonical JSON) and the hash is
written into every checkpoint it produces, so a checkpoint names exactly what made it.

Variants (``VARIANTS``):

- ``rope``: RoPE (θ = 10 000) on every layer, full causal attention, BOS at position 0.
- ``rope-nobos``: the same without BOS (position 0 holds an ordinary byte).
- ``ntk``: context extension as real NTK models are made: the first ``extend_at`` steps at
  half the context (64 positions, twice the batch so that tokens per step are equal), then
  the rotary base becomes ``θ·α^(d/(d-2))`` with ``α = 2`` and training continues at 128
  (``α = 2`` doubles the longest wavelength, as the context doubles).
- ``ntk-control``: the same extension with ``α = 1`` (the base is unchanged): only the
  scaling differs from ``ntk``.
- ``window``: RoPE, every layer a sliding window of 32 keys (the query included).
- ``window-mix``: RoPE, three window-32 layers then one global layer (Gemma-like local:global).
- ``nope``: no position encoding at all: the causal mask is the only source of position.
- ``learned``: learned absolute position embeddings added at layer 0 (GPT-2 style).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

from lens_position.ground.errors import BadInputError

Position = Literal["rope", "learned", "none"]

#: sha256 of the zoo corpus on CPython 3.11.7 (``lens_position.models.zoo.corpus``).
CORPUS_SHA256 = "a9556bec2ebbb5f223db4c16f3638551c916723adb5411f110710a5d9cc3a14e"


@dataclass(frozen=True)
class Recipe:
    """Everything that determines a zoo model's weights (given the machine).

    Sizes: ``n_layers``, ``d_model``, ``n_heads`` (``d_head = d_model / n_heads``), ``d_mlp``
    (gated SiLU MLP, RMSNorm, as in Llama). Training: ``steps`` AdamW steps of ``batch``
    sequences of ``context`` positions, learning rate ``lr`` with linear warm-up over
    ``warmup`` steps then cosine decay to ``lr * final_lr_fraction``, weight decay on
    matrices, gradient norm clipped at ``grad_clip``. Position: see the module docstring;
    ``extend_at`` > 0 trains the first ``extend_at`` steps at ``context // 2`` positions
    (``2 * batch`` sequences) with base ``rotary_base``, the rest at ``context`` with base
    ``rotary_base * ntk_alpha ** (d_head / (d_head - 2))``. Data: ``train_fraction`` < 1
    trains on that share of the train split only (evenly spaced 64 KiB blocks of it,
    :func:`lens_position.models.zoo.corpus.train_subset`; the held-out split is unchanged), to ask
    how much distinct text a result needs; a recipe at 1.0 omits it from its JSON, so the
    hashes of recipes written before the field existed are unchanged.
    """

    variant: str
    seed: int = 0
    # position (the only group that differs between variants)
    position: Position = "rope"
    rotary_base: float = 10_000.0
    attn_types: tuple[str, ...] = ("global",) * 4
    window: int | None = None
    bos: bool = True
    extend_at: int = 0
    ntk_alpha: float = 1.0
    # sizes
    n_layers: int = 4
    d_model: int = 64
    n_heads: int = 4
    d_mlp: int = 256
    context: int = 128
    # optimisation
    batch: int = 16
    steps: int = 300
    lr: float = 3e-3
    warmup: int = 20
    final_lr_fraction: float = 0.1
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    init_std: float = 0.02
    # data and bookkeeping
    corpus_sha256: str = CORPUS_SHA256
    train_fraction: float = 1.0
    eval_every: int = 100
    checkpoint_every: int = 100
    n_eval_sequences: int = 64

    def __post_init__(self) -> None:
        if len(self.attn_types) != self.n_layers:
            raise BadInputError(f"attn_types has {len(self.attn_types)} entries for {self.n_layers} layers")
        if "local" in self.attn_types and (self.window is None or self.position != "rope"):
            raise BadInputError("local layers need a window and RoPE")
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise BadInputError("d_model / n_heads must be an even whole number (RoPE rotates pairs)")
        if not 0 <= self.extend_at < self.steps:
            raise BadInputError(f"extend_at must be in [0, steps), got {self.extend_at}")
        if not 0 < self.train_fraction <= 1:
            raise BadInputError(f"train_fraction must be in (0, 1], got {self.train_fraction}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def final_rotary_base(self) -> float:
        """The rotary base after the context extension (NTK-aware: ``θ·α^(d/(d-2))``)."""
        if self.ntk_alpha == 1.0:
            return self.rotary_base
        return self.rotary_base * self.ntk_alpha ** (self.d_head / (self.d_head - 2))

    @property
    def tokens(self) -> int:
        """Training tokens (positions fed to the model, BOS included)."""
        return self.steps * self.batch * self.context

    def phase(self, step: int) -> tuple[int, int, float]:
        """``(batch, context, rotary base)`` used at ``step``."""
        if step < self.extend_at:
            return 2 * self.batch, self.context // 2, self.rotary_base
        return self.batch, self.context, self.final_rotary_base

    def lr_at(self, step: int) -> float:
        """Learning rate at ``step`` (linear warm-up, then cosine to ``final_lr_fraction``)."""
        import math

        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        progress = (step - self.warmup) / max(1, self.steps - self.warmup)
        floor = self.final_lr_fraction
        return self.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["attn_types"] = list(self.attn_types)
        d["betas"] = list(self.betas)
        if self.train_fraction == 1.0:  # added later: absent means all, as before
            del d["train_fraction"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Recipe:
        d = dict(d)
        d["attn_types"] = tuple(d["attn_types"])
        d["betas"] = tuple(d["betas"])
        return cls(**d)

    def sha256(self) -> str:
        """Hash of the canonical JSON of every field (what a checkpoint records)."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()

    def with_seed(self, seed: int) -> Recipe:
        return dataclasses.replace(self, seed=seed)


def _variants() -> dict[str, Recipe]:
    local3 = ("local", "local", "local", "global")
    return {recipe.variant: recipe for recipe in [
        Recipe("rope"),
        Recipe("rope-nobos", bos=False),
        Recipe("ntk", extend_at=150, ntk_alpha=2.0),
        Recipe("ntk-control", extend_at=150, ntk_alpha=1.0),
        Recipe("window", attn_types=("local",) * 4, window=32),
        Recipe("window-mix", attn_types=local3, window=32),
        Recipe("nope", position="none"),
        Recipe("learned", position="learned"),
    ]}


#: The default zoo: one recipe per variant (seed 0; ``recipe.with_seed(k)`` for others).
VARIANTS: dict[str, Recipe] = _variants()
DEFAULT_SEEDS: tuple[int, ...] = (0, 1, 2)


def recipe_for(variant: str, seed: int = 0) -> Recipe:
    """The recipe of ``variant`` with ``seed`` (BadInputError listing the variants)."""
    if variant not in VARIANTS:
        raise BadInputError(f"unknown zoo variant {variant!r}; the variants are {', '.join(VARIANTS)}")
    return VARIANTS[variant].with_seed(seed)
