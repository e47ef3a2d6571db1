"""``rotate``: RoPE applied from a layer's own cos/sin tables, in each pair and table layout the
bridge meets, checked against the Hugging Face functions that define those layouts (Llama's
halves, GLM's adjacent pairs from a halves table, Cohere's adjacent pairs from an interleaved
table), on drawn sizes, positions and bases."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.cohere.modeling_cohere import apply_rotary_pos_emb as cohere_rotary
from transformers.models.glm.modeling_glm import apply_rotary_pos_emb as glm_rotary
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as llama_rotary

from lens_position.models.backends import RotaryLayout, rotate


def _tables(length: int, rotary_dim: int, base: float, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    angles = torch.arange(length, dtype=torch.float64)[:, None] * inv_freq[None]
    table = angles.repeat_interleave(2, dim=-1) if interleaved else torch.cat([angles, angles], dim=-1)
    return table.cos()[None], table.sin()[None]  # [1, pos, rot], as hook_cos / hook_sin fire them


def _layout(rotary_dim: int, adjacent: bool, interleaved: bool) -> RotaryLayout:
    return RotaryLayout(frequencies=torch.zeros(rotary_dim // 2), adjacent_pairs=adjacent, rotary_dim=rotary_dim,
                        scale=1.0, rotated_here=True, interleaved_table=interleaved)


SIZES = st.tuples(st.integers(1, 3), st.integers(1, 9), st.integers(1, 4), st.sampled_from([2, 4, 8, 16]),
                  st.sampled_from([0, 2, 8]), st.sampled_from([10.0, 1e4, 1e6]), st.integers(0, 2**16))


def _inputs(sizes):
    batch, length, heads, rotary_dim, extra, base, seed = sizes
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, length, heads, rotary_dim + extra, generator=generator, dtype=torch.float64)
    k = torch.randn(batch, length, heads, rotary_dim + extra, generator=generator, dtype=torch.float64)
    return q, k, length, rotary_dim, base


def _reference(function, q, k, cos, sin, rotary_dim):
    """The Hugging Face function on its own layout ([batch, head, pos, d]), unrotated dims passed on."""
    q_rot, k_rot = function(q[..., :rotary_dim].transpose(1, 2), k[..., :rotary_dim].transpose(1, 2), cos, sin)
    return (torch.cat([q_rot.transpose(1, 2), q[..., rotary_dim:]], dim=-1),
            torch.cat([k_rot.transpose(1, 2), k[..., rotary_dim:]], dim=-1))


# family: (its rotation function, adjacent pairs, interleaved table, tolerance)
REFERENCES = {
    "llama: halves": (llama_rotary, False, False, 1e-12),
    "glm: adjacent pairs from a halves table": (glm_rotary, True, False, 1e-12),
    "cohere: adjacent pairs from an interleaved table (computed in float32)": (cohere_rotary, True, True, 1e-5),
}


@pytest.mark.parametrize("family", list(REFERENCES))
@settings(max_examples=40, deadline=None)
@given(SIZES)
def test_rotate_is_the_hugging_face_rotation_of_each_layout(family, sizes):
    function, adjacent, interleaved, atol = REFERENCES[family]
    q, k, length, rotary_dim, base = _inputs(sizes)
    cos, sin = _tables(length, rotary_dim, base, interleaved=interleaved)
    expected_q, expected_k = _reference(function, q, k, cos, sin, rotary_dim)
    layout = _layout(rotary_dim, adjacent=adjacent, interleaved=interleaved)
    assert torch.allclose(rotate(q, cos, sin, layout), expected_q, atol=atol)
    assert torch.allclose(rotate(k, cos, sin, layout), expected_k, atol=atol)
    if rotary_dim > 2 and length > 1:  # the other pair layout is another rotation
        other = dataclasses.replace(layout, adjacent_pairs=not adjacent)
        assert not torch.allclose(rotate(q, cos, sin, other), expected_q, atol=atol)


@settings(max_examples=30, deadline=None)
@given(SIZES, st.booleans(), st.booleans())
def test_rotation_keeps_each_pairs_length_and_scores_depend_on_offset_only(sizes, adjacent, interleaved):
    q, _, length, rotary_dim, base = _inputs(sizes)
    cos, sin = _tables(length, rotary_dim, base, interleaved=interleaved)
    layout = _layout(rotary_dim, adjacent=adjacent, interleaved=interleaved)
    turned = rotate(q, cos, sin, layout)
    assert torch.allclose(turned.norm(dim=-1), q.norm(dim=-1), atol=1e-10)
    # the same vector at every position: q_i . k_j depends on i - j alone
    same = q[:, :1].expand(-1, length, -1, -1)
    scores = torch.einsum("bqhd,bkhd->bhqk", rotate(same, cos, sin, layout), rotate(same, cos, sin, layout))
    for offset in range(length):
        diagonal = torch.diagonal(scores, offset=-offset, dim1=-2, dim2=-1)
        assert torch.allclose(diagonal, diagonal[..., :1].expand_as(diagonal), atol=1e-9)
