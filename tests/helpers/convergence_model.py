"""Hand-set models for the position-0 convergence tests (float64, no normalisation, d_model = 4).

- ``restoring="attention"``: block 0's attention writes ``-x + c`` at position 0 (``W_V W_O = -I``,
  ``b_O = c``; position 0 attends only to itself), so after block 0 the state is ``c`` whatever
  the embedding: converged from layer 0, the attention closing all of the gap;
- ``restoring="mlp"``: block 1's MLP writes ``-x + c`` (``relu(x) - relu(-x) = x``), so the state
  is the embedding after block 0 and ``c`` from block 1 on;
- ``restoring="half"``: block 0's attention writes ``(c - x) / 2``: the state goes half way to ``c``;
- ``restoring=None``: every block writes 0: the state stays the embedding at every layer.
"""

import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from lens_position.models.spec import LoadedModel, spec_from_config
from lens_position.models.toy import BOS_TOKEN_ID, TOY_VOCAB

D_MODEL = 4
TARGET = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)


def convergence_model(restoring: str | None, *, n_layers: int = 3, seed: int = 0) -> LoadedModel:
    cfg = HookedTransformerConfig(
        n_layers=n_layers, d_model=D_MODEL, d_head=D_MODEL, n_heads=1, n_ctx=64, d_vocab=TOY_VOCAB,
        d_mlp=2 * D_MODEL, act_fn="relu", normalization_type=None, positional_embedding_type="rotary",
        rotary_dim=D_MODEL, dtype=torch.float64, default_prepend_bos=False, seed=seed,
    )
    model = HookedTransformer(cfg)
    eye = torch.eye(D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
        model.embed.W_E.copy_(torch.randn(TOY_VOCAB, D_MODEL, generator=torch.Generator().manual_seed(seed),
                                          dtype=torch.float64))
        if restoring in ("attention", "half"):
            attn = model.blocks[0].attn
            attn.W_V[0] = eye
            attn.W_O[0] = -eye if restoring == "attention" else -0.5 * eye
            attn.b_O.copy_(TARGET if restoring == "attention" else TARGET / 2)
        elif restoring == "mlp":
            mlp = model.blocks[1].mlp
            mlp.W_in.copy_(torch.cat([eye, -eye], dim=1))
            mlp.W_out.copy_(torch.cat([-eye, eye], dim=0))
            mlp.b_out.copy_(TARGET)
    spec = spec_from_config(model, name=f"toy-convergence-{restoring}", bos_token_id=BOS_TOKEN_ID)
    return LoadedModel(model=model, tokenizer=None, spec=spec)
