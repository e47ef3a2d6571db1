"""The hand-set sink-reading model of the sink tests (``tests/unit/analyses/test_sinks.py``'s
docstring says what each head does), shared with the trajectory tests."""

import math

import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from lens_position.models.spec import LoadedModel, spec_from_config
from lens_position.models.toy import BOS_TOKEN_ID, TOY_VOCAB

BONUS = 3.0
CONTENT, BOS_MARKER, SINK_SIGNAL = 0, 1, 2


def sink_reading_model(*, bonus: float = BONUS, seed: int = 0) -> LoadedModel:
    d_head, rotary_dim = 4, 2
    cfg = HookedTransformerConfig(
        n_layers=3, d_model=6, d_head=d_head, n_heads=2, n_ctx=128, d_vocab=TOY_VOCAB,
        attn_only=True, normalization_type=None, positional_embedding_type="rotary",
        rotary_dim=rotary_dim, dtype=torch.float64, default_prepend_bos=False, seed=seed,
    )
    model = HookedTransformer(cfg)
    generator = torch.Generator().manual_seed(seed)
    scale = math.sqrt(d_head)  # TransformerLens divides scores by sqrt(d_head)

    def rand(n):
        return 1.5 * torch.randn(n, generator=generator, dtype=torch.float64)

    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
        model.embed.W_E[:, CONTENT] = 1.0
        model.embed.W_E[BOS_TOKEN_ID, BOS_MARKER] = 1.0
        for block in model.blocks:
            for head in range(2):
                block.attn.W_Q[head, CONTENT, :rotary_dim] = rand(rotary_dim)
                block.attn.W_K[head, CONTENT, :rotary_dim] = rand(rotary_dim)
        sink_reader = model.blocks[1].attn
        sink_reader.W_Q[0, CONTENT] = 0.0
        sink_reader.W_K[0, CONTENT] = 0.0
        sink_reader.W_Q[0, CONTENT, rotary_dim] = 1.0
        sink_reader.W_K[0, BOS_MARKER, rotary_dim] = bonus * scale
        sink_reader.W_V[0, BOS_MARKER, rotary_dim] = 1.0
        sink_reader.W_O[0, rotary_dim, SINK_SIGNAL] = 1.0
        downstream = model.blocks[2].attn
        downstream.W_Q[0, SINK_SIGNAL, :rotary_dim] = downstream.W_Q[0, CONTENT, :rotary_dim] * 4
        downstream.W_Q[0, CONTENT] = 0.0
        downstream.W_V[0, CONTENT, rotary_dim + 1] = 1.0
    spec = spec_from_config(model, name="toy-sink-reading", bos_token_id=BOS_TOKEN_ID)
    return LoadedModel(model=model, tokenizer=None, spec=spec)
