"""A recipe as a ``HookedTransformer``: the zoo models are TransformerLens models from birth.

Llama-like blocks (pre-RMSNorm, gated SiLU MLP, untied embeddings) with the position
mechanism of the recipe:

- ``rope``: ``positional_embedding_type="rotary"`` over the whole head (``rotary_dim =
  d_head``, GPT-NeoX pairing as in Llama); local layers use TransformerLens's
  ``attn_types``/``window_size`` mask (key ``j`` visible from query ``i`` iff
  ``i - window < j <= i``).
- ``learned``: ``positional_embedding_type="standard"`` (a trained ``W_pos`` added to the
  token embedding).
- ``none`` (NoPE): ``"standard"`` with ``W_pos`` fixed at exactly zero and excluded from
  training, so ``hook_pos_embed`` is zero and the analyses see a model with no position input.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer, HookedTransformerConfig

from typing import Any

import torch

from lens_position.models.backends.hooked import new_hooked_transformer
from lens_position.models.tiny import VOCAB_SIZE
from lens_position.models.zoo.recipe import Recipe

#: Buffers TransformerLens derives from the config; a checkpoint stores parameters only.
DERIVED_BUFFERS = ("rotary_sin", "rotary_cos", "mask", "IGNORE")
#: The RMSNorm epsilon of every zoo norm (TransformerLens's default, written out so that the
#: Hugging Face conversion, :mod:`lens_position.models.zoo.hf`, uses the very same).
RMS_NORM_EPS = 1e-5


def model_fields(recipe: Recipe, rotary_base: float | None = None) -> dict[str, Any]:
    """The ``HookedTransformerConfig`` keywords of ``recipe`` (``rotary_base`` overrides the final
    base); a :class:`~lens_position.models.mini.MiniTransformer` takes the same."""
    rope = recipe.position == "rope"
    local = "local" in recipe.attn_types
    return dict(
        n_layers=recipe.n_layers, d_model=recipe.d_model, n_heads=recipe.n_heads, d_head=recipe.d_head,
        d_mlp=recipe.d_mlp, d_vocab=VOCAB_SIZE, n_ctx=recipe.context, act_fn="silu", gated_mlp=True,
        normalization_type="RMS", final_rms=True, eps=RMS_NORM_EPS,
        positional_embedding_type="rotary" if rope else "standard",
        rotary_dim=recipe.d_head if rope else None,
        rotary_base=(rotary_base if rotary_base is not None else recipe.final_rotary_base) if rope else 10000,
        rotary_adjacent_pairs=False,
        use_local_attn=local, attn_types=list(recipe.attn_types) if local else None,
        window_size=recipe.window if local else None,
        init_weights=False, default_prepend_bos=recipe.bos, tokenizer_prepends_bos=recipe.bos,
        model_name=f"zoo:{recipe.variant}", original_architecture="zoo", dtype=torch.float32, seed=None,
    )


def hooked_config(recipe: Recipe, rotary_base: float | None = None) -> HookedTransformerConfig:
    """The ``HookedTransformerConfig`` of ``recipe`` (``rotary_base`` overrides the final base)."""
    from transformer_lens import HookedTransformerConfig  # TransformerLens 3.x (hooked backend)

    return HookedTransformerConfig(**model_fields(recipe, rotary_base))


def _new_model(recipe: Recipe, rotary_base: float | None) -> Any:
    """A HookedTransformer where TransformerLens has one, else a MiniTransformer (the same
    computation, names and parameters; :mod:`lens_position.models.mini`), with zero weights."""
    from lens_position.models.backends import hooked_available

    if hooked_available():
        return new_hooked_transformer(hooked_config(recipe, rotary_base), what="a zoo model", move_to_device=False)
    from lens_position.models.mini import MiniConfig, MiniTransformer

    fields = model_fields(recipe, rotary_base)
    for key in ("act_fn", "gated_mlp", "final_rms", "init_weights"):  # what a MiniTransformer always is
        fields.pop(key)
    return MiniTransformer(MiniConfig(**fields))


def build_model(recipe: Recipe, *, rotary_base: float | None = None, device: str = "cpu",
                initialise: bool = True) -> HookedTransformer:
    """A fresh model for ``recipe``: every matrix ~ N(0, init_std²), output projections
    scaled by ``1/sqrt(2 n_layers)`` (GPT-2), norms 1, biases 0, drawn from ``recipe.seed``
    without touching the global RNG. NoPE's ``W_pos`` is zero and frozen. A ``HookedTransformer`` on
    TransformerLens 3.x, a ``MiniTransformer`` on 4.x (:func:`_new_model`)."""
    model = _new_model(recipe, rotary_base)
    if initialise:
        generator = torch.Generator().manual_seed(recipe.seed)
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                leaf = name.split(".")[-1]
                if leaf == "W_pos":
                    scale = recipe.init_std if recipe.position == "learned" else 0.0
                    parameter.copy_(torch.randn(parameter.shape, generator=generator) * scale)
                elif leaf.startswith("W_"):
                    std = recipe.init_std
                    if leaf in ("W_O", "W_out"):
                        std /= (2 * recipe.n_layers) ** 0.5
                    parameter.copy_(torch.randn(parameter.shape, generator=generator) * std)
                elif leaf == "w":  # RMSNorm gains
                    parameter.fill_(1.0)
                else:  # biases
                    parameter.zero_()
    if recipe.position == "none":
        model.pos_embed.W_pos.requires_grad_(False)
    return model if device == "cpu" else model.to(device)


def parameters_of(model: HookedTransformer) -> dict[str, torch.Tensor]:
    """The model's parameters (no derived buffers), detached, contiguous, on CPU."""
    return {name: p.detach().to("cpu").contiguous() for name, p in model.named_parameters()}


def load_parameters(model: HookedTransformer, parameters: dict[str, Any]) -> None:
    """Load ``parameters`` into ``model``; every parameter must be given, and nothing else."""
    missing, unexpected = model.load_state_dict(parameters, strict=False)
    missing = [k for k in missing if k.split(".")[-1] not in DERIVED_BUFFERS]
    if missing or unexpected:
        raise ValueError(f"checkpoint does not fit the recipe's model: missing {missing}, "
                         f"unexpected {unexpected}")
