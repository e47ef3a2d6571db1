"""Tiny hand-set HookedTransformers whose attention scores are known by construction.

They are the ground truths of the mask/residual decomposition (the concepts page) and the
smallest models the tutorials run on. All are real ``HookedTransformer`` forward passes
(RoPE, the model's own causal or sliding-window mask), not hooks that overwrite scores:

- :func:`offset_only_model`: every token embeds to the same vector, ``W_O = 0`` so the
  residual stream never changes, and the query/key vectors are therefore the same at every
  position. RoPE then makes the score ``s[i, j] = g(i - j)`` a function of the offset only.
  Options turn it into the other ground truths: ``uniform=True`` zeroes ``W_Q`` (all scores
  equal); ``window=W`` makes every layer a sliding window of ``W`` keys; ``bos_bonus=b``
  gives the BOS token an extra embedding direction that ``W_K`` writes into a non-rotated
  key dimension, so the key at position 0 gets the fixed bonus ``b`` from every query,
  a genuine residual-stream effect.
- :func:`random_model`: a randomly initialised small Llama/Gemma-like model (RMSNorm, SiLU
  MLPs, grouped-query attention, optional local layers), for tests that need generic
  attention rather than designed attention.

Token ids in these models: ``BOS_TOKEN_ID`` marks position 0 (only meaningful with
``bos_bonus``); any other id in ``range(d_vocab)`` is an ordinary token.

On TransformerLens 3.x they are ``HookedTransformer`` models; 4.0 removed that class, and there
they are :class:`~lens_position.models.mini.MiniTransformer` models, which compute what a
``HookedTransformer`` computes with the same weights, hook names and parameter names
(``tests/unit/models/test_mini.py`` compares every hook of every model here on 3.x). The hand-set
models hold the same weights on both lines; :func:`random_model` is seeded on each line, and its
random weights differ between them (each line's own initialisation).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from lens_position.models.backends import hooked_available
from lens_position.models.backends.hooked import new_hooked_transformer
from lens_position.models.mini import MiniConfig, MiniTransformer
from lens_position.models.spec import LoadedModel, spec_from_config

BOS_TOKEN_ID = 1
TOY_VOCAB = 8

# HookedTransformerConfig keys a MiniTransformer has no field for: what it always is, or how its
# random weights are drawn (random_model's own initialisation on 4.x)
_MINI_FIXED = {"act_fn": "silu", "gated_mlp": True}
_MINI_INIT = ("init_weights", "initializer_range")


def new_toy_model(config: dict, *, what: str, line: str = "auto") -> torch.nn.Module:
    """The toy model of ``config`` (``HookedTransformerConfig`` keywords): a ``HookedTransformer``
    where TransformerLens has one (``line="auto"`` on 3.x, or ``"hooked"``), else (``"auto"`` on 4.x,
    or ``"mini"``) a :class:`MiniTransformer` of the same configuration, with zero weights unless
    ``init_weights`` (then normal weights of std ``initializer_range`` from ``seed``, unit norms)."""
    if line == "hooked" or (line == "auto" and hooked_available()):
        return new_hooked_transformer(config, what=what)
    for key, value in _MINI_FIXED.items():
        if key in config and config[key] != value:
            raise ValueError(f"{what}: MiniTransformer has {key}={value!r}, not {config[key]!r}")
    fields = {k: v for k, v in config.items() if k not in _MINI_FIXED and k not in _MINI_INIT}
    model = MiniTransformer(MiniConfig(**fields))
    if config.get("init_weights"):
        generator = torch.Generator().manual_seed(int(config.get("seed") or 0))
        std = float(config.get("initializer_range", 0.02))
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.split(".")[-1].lstrip("_").startswith("W_"):
                    param.copy_(std * torch.randn(param.shape, generator=generator, dtype=param.dtype))
    return model


def offset_only_model(
    *,
    n_layers: int = 1,
    n_heads: int = 2,
    n_kv_heads: int | None = None,
    d_head: int = 8,
    window: int | None = None,
    uniform: bool = False,
    bos_bonus: float = 0.0,
    score_scale: float = 1.5,
    n_ctx: int = 512,
    rotary_base: float = 10_000.0,
    seed: int = 0,
) -> LoadedModel:
    """A model whose scores depend only on the offset ``i - j``, up to a key-0 bonus.

    Residual stream (``d_model = 4``): direction 0 is 1 for every token ("content"),
    direction 1 is 1 only for ``BOS_TOKEN_ID`` ("BOS marker"). Head layout: the first half
    of each head's dimensions is rotated by RoPE, the second half is not.

    - ``W_Q`` maps the content direction to a random rotated query (entries of standard
      deviation ``score_scale``) plus 1 in the first non-rotated dimension.
    - ``W_K`` maps the content direction to a random rotated key, and the BOS marker to
      ``bos_bonus * sqrt(d_head)`` in that non-rotated dimension, so after the
      ``1/sqrt(d_head)`` scale the key at position 0 gains exactly ``bos_bonus`` when the
      token there is ``BOS_TOKEN_ID``.
    - ``W_O = 0``: every layer reads the same residual stream, so every layer obeys the
      same construction. With ``uniform=True`` ``W_Q = 0`` and all scores are 0.

    Computations run in float64 so "zero to float precision" means ~1e-15.
    """
    if d_head % 4:
        raise ValueError("d_head must be a multiple of 4 (half rotated, in pairs)")
    rotary_dim = d_head // 2
    local = window is not None
    model = new_toy_model(dict(
        n_layers=n_layers, d_model=4, d_head=d_head, n_heads=n_heads, n_ctx=n_ctx,
        d_vocab=TOY_VOCAB, attn_only=True, normalization_type=None,
        positional_embedding_type="rotary", rotary_dim=rotary_dim, rotary_base=rotary_base,
        n_key_value_heads=n_kv_heads, use_local_attn=local,
        attn_types=["local"] * n_layers if local else None, window_size=window,
        dtype=torch.float64, default_prepend_bos=False, seed=seed,
    ), what="offset_only_model (a hand-set toy model)")
    generator = torch.Generator().manual_seed(seed)
    n_kv = n_kv_heads or n_heads
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
        model.embed.W_E[:, 0] = 1.0
        model.embed.W_E[BOS_TOKEN_ID, 1] = 1.0
        for block in model.blocks:
            attn = block.attn
            if not uniform:
                q_rot = score_scale * torch.randn(n_heads, rotary_dim, generator=generator, dtype=torch.float64)
                attn.W_Q[:, 0, :rotary_dim] = q_rot
                attn.W_Q[:, 0, rotary_dim] = 1.0
            k_rot = score_scale * torch.randn(n_kv, rotary_dim, generator=generator, dtype=torch.float64)
            w_k = attn._W_K if n_kv_heads is not None else attn.W_K
            w_k[:, 0, :rotary_dim] = k_rot
            w_k[:, 1, rotary_dim] = bos_bonus * math.sqrt(d_head)
    spec = spec_from_config(
        model, name="toy-offset-only", source="custom", bos_token_id=BOS_TOKEN_ID,
        extra={"uniform": uniform, "bos_bonus": bos_bonus, "score_scale": score_scale, "seed": seed},
    )
    return LoadedModel(model=model, tokenizer=None, spec=spec)


def random_model(
    *,
    n_layers: int = 2,
    n_heads: int = 4,
    n_kv_heads: int | None = 2,
    d_model: int = 32,
    d_head: int = 8,
    attn_types: Sequence[str] | None = ("local", "global"),
    window: int | None = 8,
    d_vocab: int = 50,
    n_ctx: int = 256,
    init_range: float = 0.3,
    seed: int = 0,
) -> LoadedModel:
    """A randomly initialised small RoPE model (RMSNorm, gated SiLU MLP, GQA, local layers).

    ``init_range`` is the weight standard deviation; the default is larger than a trained
    model's init so that attention patterns are far from uniform. float32, like the real
    models.
    """
    local = attn_types is not None and "local" in attn_types
    model = new_toy_model(dict(
        n_layers=n_layers, d_model=d_model, d_head=d_head, n_heads=n_heads, n_ctx=n_ctx,
        d_vocab=d_vocab, d_mlp=2 * d_model, act_fn="silu", gated_mlp=True, normalization_type="RMS",
        positional_embedding_type="rotary", rotary_dim=d_head, n_key_value_heads=n_kv_heads,
        use_local_attn=local, attn_types=list(attn_types) if local and attn_types is not None else None,
        window_size=window if local else None, default_prepend_bos=False,
        init_weights=True, initializer_range=init_range, seed=seed,
    ), what="random_model (a toy model)")
    spec = spec_from_config(model, name="toy-random", source="custom", bos_token_id=BOS_TOKEN_ID,
                            extra={"seed": seed, "init_range": init_range})
    return LoadedModel(model=model, tokenizer=None, spec=spec)


def toy_tokens(n: int, length: int, *, d_vocab: int = TOY_VOCAB, bos: bool = True, seed: int = 0) -> torch.Tensor:
    """``n`` random sequences of ``length`` tokens over ``range(2, d_vocab)``, with
    ``BOS_TOKEN_ID`` at position 0 when ``bos``. Shape ``[n, length]``, int64."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(2, d_vocab, (n, length), generator=generator)
    if bos:
        tokens[:, 0] = BOS_TOKEN_ID
    return tokens


SINK_KINDS = ("position", "bos", "mixed", "none")


def sink_origin_model(kind: str, *, bonus: float = 8.0, n_ctx: int = 256, seed: int = 0) -> LoadedModel:
    """A one-layer, two-head model whose attention sink has a known origin (``kind``):

    - ``"position"``: both heads add ``bonus`` to the score of key 0, whatever token is there
      (a learned position embedding marks position 0): a position-driven sink;
    - ``"bos"``: both heads add ``bonus`` to every key holding ``BOS_TOKEN_ID``, wherever it is:
      a BOS-driven sink;
    - ``"mixed"``: head 0 is the first kind, head 1 the second;
    - ``"none"``: every score is 0 (uniform causal attention), no sink.

    Residual stream (``d_model = 4``): direction 0 is 1 for every token, direction 1 is 1 for
    ``BOS_TOKEN_ID``, direction 2 is 1 at position 0 (``W_pos[0]``). ``W_Q`` maps direction 0 to
    1 in query dimension 0; ``W_K`` maps direction 1 and/or 2 to ``bonus * sqrt(d_head)`` in key
    dimension 0, so after the ``1/sqrt(d_head)`` scale the marked key's score is ``bonus`` and every
    other score 0. Real forward passes (learned absolute positions, causal mask), float64, on either
    TransformerLens line (module docstring).
    """
    if kind not in SINK_KINDS:
        raise ValueError(f"kind must be one of {SINK_KINDS}, got {kind!r}")
    d_head = 4
    model = new_toy_model(dict(
        n_layers=1, d_model=4, d_head=d_head, n_heads=2, n_ctx=n_ctx, d_vocab=TOY_VOCAB, attn_only=True,
        normalization_type=None, positional_embedding_type="standard", dtype=torch.float64,
        default_prepend_bos=False, seed=seed,
    ), what="sink_origin_model (a hand-set toy model)")
    marks = {"position": ((2, 2)), "bos": ((1, 1)), "mixed": ((2, 1)), "none": ()}[kind]
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
        model.embed.W_E[:, 0] = 1.0
        model.embed.W_E[BOS_TOKEN_ID, 1] = 1.0
        model.pos_embed.W_pos[0, 2] = 1.0
        attn = model.blocks[0].attn
        attn.W_Q[:, 0, 0] = 1.0
        for head, direction in enumerate(marks):
            attn.W_K[head, direction, 0] = bonus * math.sqrt(d_head)
    spec = spec_from_config(model, name=f"toy-sink-{kind}", source="custom", bos_token_id=BOS_TOKEN_ID,
                            extra={"kind": kind, "bonus": bonus, "seed": seed})
    return LoadedModel(model=model, tokenizer=None, spec=spec)
