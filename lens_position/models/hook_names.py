"""The hook names of the seam, in one place: which block a hook sits in, and the shape of its
activation (position on axis 1; a head axis at 2 for the per-head attention hooks). Both backends
give these names (:mod:`lens_position.models.backends`)."""

from __future__ import annotations

import re
from collections.abc import Sequence

BLOCK_HOOK = re.compile(r"^blocks\.(\d+)\.")
# hooks that run before the first block
BEFORE_BLOCKS = ("hook_embed", "hook_pos_embed", "hook_tokens")
# hooks whose activation is [batch, pos, ...] (position on axis 1, head on axis 2 if any)
POSITION_AXIS_HOOK = re.compile(
    r"^(hook_embed|hook_pos_embed|blocks\.\d+\.(hook_resid_pre|hook_resid_mid|hook_resid_post|"
    r"hook_attn_out|hook_mlp_out|ln1\.hook_normalized|ln2\.hook_normalized|"
    r"attn\.hook_(q|k|v|z|result|rot_q|rot_k)|mlp\.hook_(pre|post|pre_linear)))$"
)
# the per-head attention hooks, [batch, pos, head, d_head]
HEAD_AXIS_HOOK = re.compile(r"attn\.hook_(q|k|v|z|result|rot_q|rot_k)$")
# the key and value hooks
KEY_VALUE_HOOK = re.compile(r"attn\.hook_(k|v)$")


def block_of(hook_name: str) -> int | None:
    """Block index of a hook (``-1`` before the blocks); None after them (final norm, logits)."""
    match = BLOCK_HOOK.match(hook_name)
    if match:
        return int(match.group(1))
    if hook_name in BEFORE_BLOCKS:
        return -1
    return None


def needed_stop(hook_names: Sequence[str]) -> int | None:
    """The smallest ``stop_at_layer`` that still runs every hook in ``hook_names`` (None: the
    whole model). ``stop_at_layer = n_layers`` runs every block but skips the unembedding."""
    blocks = [block_of(name) for name in hook_names]
    if not blocks or any(b is None for b in blocks):
        return None
    return max(b for b in blocks if b is not None) + 1
