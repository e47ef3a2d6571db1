"""Activation patching and ablation: one engine, thin named entry points, fast.

Activation patching asks a causal question. Run the model on a *target* input, but replace
one activation (the residual stream at layer 5, position 0; one head's key at position 0;
the embedding of the first token) by a value taken from a *source* run (a different token
0, no BOS), by a summary (the mean over inputs), or by zero, and measure what changes
downstream: the logits, a head's output, or a head's residual component ``R``
(``lens_position.analyses.decompose``). If changing that one activation changes the measurement, the
activation carries what the measurement depends on; if it does not, it does not.

Here an intervention is a value, not a side effect: a :class:`Patch` says *which* activation
(a TransformerLens hook name), *where* (position, head) and *what to put there*. Apply it to
any forward pass with :meth:`Patch.hook` (a ``(name, fn)`` pair for ``model.hooks`` or for
``decompose(fwd_hooks=...)``), or hand many conditions (each a list of patches) to
:func:`run_patches`, which

- **resumes from a cached residual**: a condition whose earliest patch sits in block ``l``
  starts at ``resid_pre[l]`` of the target run (``start_at_layer``), so layers ``< l`` are
  never recomputed;
- **batches conditions**: the target batch is repeated once per condition and each
  condition's patches touch only its own rows, so a sweep of ``layers x positions`` patches
  costs ``layers`` forward passes of ``positions x batch`` rows, not ``layers x positions``
  passes;
- **always removes its hooks** (``model.hooks`` context manager), also when an exception
  flies.

Named entry points build the usual patches: :func:`embedding_patch` (another token's
embedding, the mean embedding over the vocabulary, or a random vector of the same norm),
:func:`resid_pre_patch` (``resid_pre`` at (layer, position) from a source run),
:func:`head_kv_patches` (one head's key and/or value at a position from a source run) and
:func:`head_ablation` (zero or mean ablation of heads), and :func:`resid_pre_sweep` runs the
classic ``layers x positions`` residual-stream sweep (the fast twin of
``transformer_lens.patching.get_act_patch_resid_pre``).

Patching a run with its own activations changes nothing (tested bit-for-bit on small
models; within float round-off where batching changes the matmul shapes).

The package: :mod:`~lens_position.analyses.patching.engine` (the passes),
:mod:`~lens_position.analyses.patching.patches` (the named patches) and
:mod:`~lens_position.analyses.patching.sweeps` (sweeps and the TransformerLens-compatible entry
points, ``partial`` values of one engine); every public name is importable from here.
"""

from lens_position.analyses.patching.engine import (
    PASS_OVERHEAD_TOKENS,
    PatchPass,
    as_tokens,
    cache_activations,
    check_same_layout,
    plan_passes,
    prefix_reuse_unsupported,
    resid_pre_stack,
    run_patches,
    token_layers,
)
from lens_position.analyses.patching.patches import (
    Ablation,
    Replacement,
    default_replacement_token,
    embedding_patch,
    head_ablation,
    head_kv_patches,
    kv_head_of,
    replacement_embedding,
    resid_pre_patch,
)
from lens_position.analyses.patching.sweeps import (
    SWEPT_ACTIVATIONS,
    PatchSweep,
    Reduce,
    activation_sweep,
    get_act_patch_attn_head_out_by_pos,
    get_act_patch_attn_out,
    get_act_patch_mlp_out,
    get_act_patch_resid_pre,
    min_token_layers,
    resid_pre_sweep,
)
from lens_position.core.patch import (
    Condition,
    Patch,
    act_name,
    patches_as_hooks,
    source_activation,
)

__all__ = [
    'Ablation',
    "Condition",
    "PASS_OVERHEAD_TOKENS",
    "Patch",
    "PatchPass",
    "PatchSweep",
    "Reduce",
    "Replacement",
    "SWEPT_ACTIVATIONS",
    "act_name",
    "activation_sweep",
    "as_tokens",
    "cache_activations",
    "check_same_layout",
    "default_replacement_token",
    "embedding_patch",
    "get_act_patch_attn_head_out_by_pos",
    "get_act_patch_attn_out",
    "get_act_patch_mlp_out",
    "get_act_patch_resid_pre",
    "head_ablation",
    "head_kv_patches",
    "kv_head_of",
    "min_token_layers",
    "patches_as_hooks",
    "plan_passes",
    "prefix_reuse_unsupported",
    "replacement_embedding",
    "resid_pre_patch",
    "resid_pre_stack",
    "resid_pre_sweep",
    "run_patches",
    "source_activation",
    "token_layers",
]
