"""Named patches: the usual interventions as :class:`~lens_position.core.patch.Patch` values.

:func:`embedding_patch` (another token's embedding, the mean embedding over the vocabulary, or a
random vector of the same norm, :func:`replacement_embedding`), :func:`resid_pre_patch`
(``resid_pre`` at (layer, position) from a source run), :func:`head_kv_patches` (one head's key
and/or value at a position from a source run) and :func:`head_ablation` (zero or mean ablation of
heads). Each returns values; run them with :func:`lens_position.analyses.patching.run_patches`, a
decomposition's ``patches=`` or ``Patch.hook()``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from jaxtyping import Float

from lens_position.analyses.patching.engine import as_tokens, cache_activations
from lens_position.core.checks import check_heads, check_position
from lens_position.core.inputs import Prompts
from lens_position.core.patch import Patch, source_activation
from lens_position.ground.errors import BadInputError
from lens_position.models.spec import LoadedModel, public

Replacement = Literal["token", "mean", "random"]
Ablation = Literal["zero", "mean"]


@public
def kv_head_of(loaded: LoadedModel, head: int) -> int:
    """The checkpoint's key/value head that query head ``head`` reads: ``head // (n_heads /
    n_kv_heads)`` with grouped-query attention, ``head`` itself without. (The hooks carry
    one ungrouped copy per query head; this names the weights the copy comes from.)"""
    spec = loaded.spec
    return head // (spec.n_heads // spec.n_kv_heads)


@public
def replacement_embedding(
    loaded: LoadedModel,
    prompts: Prompts,
    replacement: Replacement,
    *,
    position: int = 0,
    token: int | None = None,
    seed: int = 0,
) -> Float[torch.Tensor, "batch d_model"]:
    """The vector that replaces the embedding at ``position`` (one row per prompt).

    - ``"token"``: the embedding of ``token`` (default: a token drawn with ``seed`` from the
      vocabulary, never the prompts' own token at ``position``).
    - ``"mean"``: the mean embedding over the whole vocabulary.
    - ``"random"``: a Gaussian direction (``seed``) scaled, per prompt, to the norm of the
      embedding it replaces.
    """
    tokens = as_tokens(loaded, prompts)
    check_position(position, tokens.shape[1])
    W_E = loaded.backend.W_E.detach()  # rows as hook_embed carries them (scaled, for Gemma)
    original = W_E[tokens[:, position]]
    if replacement == "token":
        if token is None:
            token = default_replacement_token.body(loaded, tokens, position=position, seed=seed)
        if not 0 <= token < loaded.backend.d_vocab:
            raise BadInputError(f"replacement token {token} is outside the vocabulary")
        return W_E[token].expand_as(original).clone()
    if replacement == "mean":
        return W_E.mean(0).expand_as(original).clone()
    if replacement == "random":
        generator = torch.Generator().manual_seed(seed)
        direction = torch.randn(original.shape[-1], generator=generator).to(original)
        return direction / direction.norm() * original.norm(dim=-1, keepdim=True)
    raise BadInputError(f"unknown replacement {replacement!r}; use 'token', 'mean' or 'random'")


@public
def default_replacement_token(
    loaded: LoadedModel, prompts: Prompts, *, position: int = 0, seed: int = 0
) -> int:
    """A token drawn with ``seed`` from the vocabulary, avoiding every token the prompts hold
    at ``position`` (so the replacement really changes the input) and the tokenizer's
    special tokens (BOS, EOS, padding, chat markers), when there is a tokenizer."""
    tokens = as_tokens(loaded, prompts)
    avoid = set(tokens[:, position].tolist())
    limit = loaded.backend.d_vocab
    if loaded.tokenizer is not None:
        avoid |= set(getattr(loaded.tokenizer, "all_special_ids", []))
        avoid |= set(getattr(loaded.tokenizer, "added_tokens_decoder", {}).keys())
        limit = min(limit, len(loaded.tokenizer))
    generator = torch.Generator().manual_seed(seed)
    for candidate in torch.randperm(limit, generator=generator).tolist():
        if candidate not in avoid:
            return candidate
    raise BadInputError("every vocabulary entry occurs at that position; pass token=")


@public
def embedding_patch(
    loaded: LoadedModel,
    prompts: Prompts,
    replacement: Replacement | torch.Tensor = "token",
    *,
    position: int = 0,
    token: int | None = None,
    seed: int = 0,
) -> Patch:
    """Replace the embedding at ``position`` (``hook_embed``) before the forward pass, with
    another token's embedding, the mean embedding, a random vector of the same norm
    (:func:`replacement_embedding`), or a given ``Float[Tensor, "d_model"]`` /
    ``Float[Tensor, "batch d_model"]``."""
    if isinstance(replacement, torch.Tensor):
        check_position(position, as_tokens(loaded, prompts).shape[1])
        value, label = replacement, "given"
    else:
        value = replacement_embedding.body(loaded, prompts, replacement, position=position, token=token, seed=seed)
        label = replacement
    return Patch("hook_embed", value, position=position, label=f"embed[{position}]={label}")


def resid_pre_patch(
    source: Any,
    layer: int,
    position: int,
) -> Patch:
    """``resid_pre[layer][:, position]`` from a source run: a TransformerLens
    ``ActivationCache`` (``model.run_with_cache``, :func:`cache_activations`) or a dict holding
    ``blocks.{layer}.hook_resid_pre``, or a :func:`resid_pre_stack`
    ``Float[Tensor, "layer batch pos d_model"]``."""
    name = f"blocks.{layer}.hook_resid_pre"
    if not isinstance(source, torch.Tensor):
        activation = source_activation(source, name)
    else:
        if not 0 <= layer < source.shape[0]:
            raise BadInputError(f"layer {layer} is out of range (source has {source.shape[0]})")
        activation = source[layer]
    check_position(position, activation.shape[1])
    return Patch(name, activation[:, position], position=position,
                 label=f"resid_pre[{layer}][{position}]")


@public
def head_kv_patches(
    loaded: LoadedModel,
    source: dict[str, torch.Tensor],
    *,
    layer: int,
    head: int,
    position: int,
    parts: Sequence[Literal["k", "v"]] = ("k", "v"),
) -> list[Patch]:
    """One head's key and/or value at ``position`` from a source run.

    ``source`` holds ``blocks.{layer}.attn.hook_k`` / ``hook_v``: a TransformerLens
    ``ActivationCache`` or a dict (:func:`cache_activations`). ``head`` is a query head, for
    every model (:class:`Patch`): the patch reaches that head only, whatever the loader. A
    source cached from a grouped-query model before lens_position ungrouped it (``hook_k``
    with one entry per key/value head) is read at the key/value head of ``head``
    (:func:`kv_head_of`): the same vector.
    """
    loaded = loaded  # ungroups a bare grouped-query model's hooks
    spec = loaded.spec
    check_heads([(layer, head)], spec.n_layers, spec.n_heads)
    patches = []
    for part in parts:
        name = f"blocks.{layer}.attn.hook_{part}"
        activation = source_activation(source, name)
        check_position(position, activation.shape[1])
        n_source_heads = activation.shape[2]
        if n_source_heads == spec.n_heads:
            index = head
        elif n_source_heads == spec.n_kv_heads:
            index = kv_head_of.body(loaded, head)
        else:
            raise BadInputError(f"the source's {name} has {n_source_heads} heads; the model has "
                                f"{spec.n_heads} query heads and {spec.n_kv_heads} key/value heads")
        patches.append(Patch(name, activation[:, position, index], position=position,
                             head=head, label=f"{part}[{layer}.{head}][{position}]"))
    return patches


@public
def head_ablation(
    loaded: LoadedModel,
    heads: Sequence[tuple[int, int]],
    kind: Ablation = "zero",
    *,
    reference: Any = None,
) -> list[Patch]:
    """Ablate heads by setting their output ``z`` (``blocks.l.attn.hook_z``, before ``W_O``)
    at every position: to zero, or to its mean over the prompts and positions of
    ``reference`` (a PromptSet or token tensor, or the already cached activations of such a
    run, ``{"blocks.l.attn.hook_z": Float[Tensor, "batch pos head d_head"]}``; required for
    ``kind="mean"``)."""
    check_heads(heads, loaded.spec.n_layers, loaded.spec.n_heads)
    if kind == "zero":
        return [Patch(f"blocks.{layer}.attn.hook_z", 0.0, head=head, label=f"zero[{layer}.{head}]")
                for layer, head in heads]
    if kind != "mean":
        raise BadInputError(f"unknown ablation {kind!r}; use 'zero' or 'mean'")
    if reference is None:
        raise BadInputError("mean ablation needs reference prompts to take the mean over")
    names = sorted({f"blocks.{layer}.attn.hook_z" for layer, _ in heads})
    if isinstance(reference, Mapping) or hasattr(reference, "cache_dict"):  # a dict or an ActivationCache
        missing = [name for name in names if name not in reference]
        if missing:
            raise BadInputError(f"the reference activations lack {missing}; cache them first")
        store = reference
    else:
        store = cache_activations.body(loaded, reference, names)
    return [Patch(f"blocks.{layer}.attn.hook_z", store[f"blocks.{layer}.attn.hook_z"][:, :, head].mean((0, 1)),
                  head=head, label=f"mean[{layer}.{head}]") for layer, head in heads]
