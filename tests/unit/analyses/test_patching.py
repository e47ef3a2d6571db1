"""The patching engine: self-patches change nothing, resumed and batched runs equal plain
TransformerLens runs, hooks never leak, bad input is refused with a clear error."""

import dataclasses

import pytest
import torch
from transformer_lens.patching import get_act_patch_resid_pre

from lens_position.analyses import patching
from lens_position.core.data import PromptSet
from lens_position.core.inputs import checked_prompts
from lens_position.ground.errors import BadInputError
from lens_position.models.toy import random_model


@pytest.fixture(scope="module")
def model():
    # GQA (4 query / 2 kv heads) and a sliding-window layer, so resumption must respect both.
    return random_model(n_layers=3, attn_types=("local", "global", "local"), window=6, seed=1)


@pytest.fixture(scope="module")
def tokens():
    generator = torch.Generator().manual_seed(0)
    return torch.randint(2, 50, (3, 10), generator=generator)


def last_logit_gap(logits):
    return logits[:, -1, 3].mean() - logits[:, -1, 7].mean()


def no_hooks_left(hooked):
    return all(not hp._forward_hooks for hp in hooked.hook_dict.values())


def test_patching_a_run_with_its_own_resid_pre_changes_nothing(model, tokens):
    hooked = model.model
    with torch.no_grad():
        clean = last_logit_gap(hooked(tokens))
    sweep = patching.resid_pre_sweep(model, tokens, tokens, last_logit_gap)
    assert sweep.values.shape == (3, 10)
    torch.testing.assert_close(sweep.values, clean.expand(3, 10), atol=1e-6, rtol=0)


def test_self_patches_of_embedding_keys_values_and_heads_change_nothing(model, tokens):
    hooked = model.model
    names = [f"blocks.{l}.attn.hook_{p}" for l in range(3) for p in ("k", "v", "z")]
    own = patching.cache_activations(model, tokens, names)
    own_embed = hooked.W_E.detach()[tokens[:, 4]]
    conditions = [
        [patching.embedding_patch(model, tokens, own_embed, position=4)],
        patching.head_kv_patches(model, own, layer=1, head=3, position=0),
        patching.head_kv_patches(model, own, layer=2, head=0, position=9, parts=("k",)),
        [patching.Patch("blocks.1.attn.hook_z", own["blocks.1.attn.hook_z"][:, :, 2], head=2)],
    ]
    values = patching.run_patches(model, tokens, conditions, lambda logits: logits)
    with torch.no_grad():
        clean = hooked(tokens)
    for value in values:
        torch.testing.assert_close(value, clean, atol=1e-5, rtol=0)


def test_resid_pre_sweep_matches_transformer_lens(model, tokens):
    source = tokens.clone()
    source[:, 0] = 11
    source[:, 6] = 23
    ours = patching.resid_pre_sweep(model, tokens, source, last_logit_gap, batch_size=7)
    _, source_cache = model.model.run_with_cache(source)
    reference = get_act_patch_resid_pre(model.model, tokens, source_cache, last_logit_gap)
    torch.testing.assert_close(ours.values, reference, atol=1e-5, rtol=0)
    assert list(ours.frame.columns) == ["layer", "position", "metric"]
    assert len(ours.frame) == 30
    # the patch is not a no-op: position 0 and 6 of layer 0 move the metric
    assert (ours.values[0, 0] - ours.values[0, 1]).abs() > 1e-4


def test_results_do_not_depend_on_how_conditions_are_batched(model, tokens):
    source = tokens.flip(0)
    one = patching.resid_pre_sweep(model, tokens, source, last_logit_gap, batch_size=1)
    many = patching.resid_pre_sweep(model, tokens, source, last_logit_gap, batch_size=1000)
    torch.testing.assert_close(one.values, many.values, atol=1e-5, rtol=0)


def test_hooks_are_removed_after_success_and_after_errors(model, tokens):
    hooked = model.model
    patch = patching.Patch("blocks.1.hook_resid_pre", 0.0, position=2)
    patching.run_patches(model, tokens, [[patch]], lambda acts: acts["blocks.2.hook_resid_pre"].sum(),
                         read=["blocks.2.hook_resid_pre"])
    assert no_hooks_left(hooked)

    def failing_metric(_):
        raise RuntimeError("metric failed")

    with pytest.raises(RuntimeError, match="metric failed"):
        patching.run_patches(model, tokens, [[patch]], failing_metric)
    assert no_hooks_left(hooked)
    misfit = patching.Patch("blocks.1.hook_resid_pre", torch.ones(5, 32), position=2)
    with pytest.raises(BadInputError, match="does not fit"):
        patching.run_patches(model, tokens, [[misfit]], last_logit_gap)
    assert no_hooks_left(hooked)


def test_zero_ablation_zeroes_exactly_that_head(model, tokens):
    patches = patching.head_ablation(model, [(1, 2)], "zero")
    read = patching.run_patches(model, tokens, [patches], lambda acts: acts["blocks.1.attn.hook_z"],
                                read=["blocks.1.attn.hook_z"])[0]
    assert read[:, :, 2].abs().max() == 0
    assert read[:, :, [0, 1, 3]].abs().min(dim=-1).values.max() > 0


def test_mean_ablation_sets_the_head_to_its_mean_over_the_reference(model, tokens):
    hooked = model.model
    reference = patching.cache_activations(model, tokens, ["blocks.0.attn.hook_z"])["blocks.0.attn.hook_z"]
    patches = patching.head_ablation(model, [(0, 1)], "mean", reference=tokens)
    read = patching.run_patches(model, tokens, [patches], lambda acts: acts["blocks.0.attn.hook_z"],
                                read=["blocks.0.attn.hook_z"])[0]
    expected = reference[:, :, 1].mean((0, 1)).expand_as(read[:, :, 1])
    torch.testing.assert_close(read[:, :, 1], expected)
    with pytest.raises(BadInputError, match="reference"):
        patching.head_ablation(hooked, [(0, 1)], "mean")


def test_embedding_replacements_are_what_they_say(model, tokens):
    W_E = model.model.W_E.detach()
    bos = tokens.clone()
    bos[:, 0] = 1
    token = patching.replacement_embedding(model, bos, "token", token=9)
    mean = patching.replacement_embedding(model, bos, "mean")
    random = patching.replacement_embedding(model, bos, "random", seed=3)
    torch.testing.assert_close(token, W_E[9].expand(3, -1))
    torch.testing.assert_close(mean, W_E.mean(0).expand(3, -1))
    torch.testing.assert_close(random.norm(dim=-1), W_E[1].norm().expand(3))
    assert torch.nn.functional.cosine_similarity(random[0], W_E[1], dim=0).abs() < 0.9
    drawn = patching.default_replacement_token(model, bos, seed=0)
    assert drawn != 1 and 0 <= drawn < 50


def test_a_key_patch_reaches_only_its_query_head_on_a_grouped_query_model(model, tokens):
    # heads 2 and 3 share the checkpoint's kv head 1, but lens_position runs every model with
    # ungrouped K/V hooks, so a key patch on query head 3 reaches head 3 only (as with load_model)
    source = tokens.clone()
    source[:, 0] = 17
    other = patching.cache_activations(model, source, ["blocks.1.attn.hook_k"])
    patches = patching.head_kv_patches(model, other, layer=1, head=3, position=0, parts=("k",))
    assert [p.head for p in patches] == [3]
    name = "blocks.1.attn.hook_pattern"
    base, patched = patching.run_patches(
        model, tokens, [[], patches], lambda acts: acts[name], read=[name])
    change = (patched - base).abs().amax(dim=(0, 2, 3))
    assert patching.kv_head_of(model, 3) == 1
    assert change[3] > 1e-4
    assert change[0] == 0 and change[1] == 0 and change[2] == 0


def test_a_patch_at_layer_l_resumes_there(model, tokens):
    # Hooks of earlier blocks do not run in a resumed pass: that is the saving.
    seen = patching.run_patches(
        model, tokens, [[patching.Patch("blocks.2.hook_resid_pre", 0.0, position=1)]],
        lambda acts: torch.tensor(sorted(int(n.split(".")[1]) for n in acts)),
        read=[f"blocks.{l}.hook_resid_post" for l in range(3)])
    assert seen.tolist() == [[2]]


def test_bad_input_gets_a_clear_error(model, tokens):
    with pytest.raises(BadInputError, match="out of range"):
        patching.run_patches(model, tokens, [[patching.Patch("blocks.0.hook_resid_pre", 0.0, position=10)]],
                             last_logit_gap)
    with pytest.raises(BadInputError, match="out of range"):
        patching.resid_pre_sweep(model, tokens, tokens, last_logit_gap, layers=[3])
    with pytest.raises(BadInputError, match="same N and T"):
        patching.resid_pre_sweep(model, tokens, tokens[:, :8], last_logit_gap)
    with pytest.raises(BadInputError, match="vocabulary"):
        patching.resid_pre_sweep(model, tokens, tokens + 100, last_logit_gap)
    with pytest.raises(BadInputError, match="head 4 is out of range"):
        patching.head_ablation(model, [(0, 4)])
    with pytest.raises(BadInputError, match="no hook named"):
        patching.run_patches(model, tokens, [[patching.Patch("blocks.9.hook_resid_pre", 0.0)]],
                             last_logit_gap)
    with pytest.raises(BadInputError, match="not a \\[batch, pos"):
        patching.run_patches(model, tokens, [[patching.Patch("blocks.0.attn.hook_pattern", 0.0)]],
                             last_logit_gap)
    with pytest.raises(BadInputError, match="unknown replacement"):
        patching.replacement_embedding(model, tokens, "noise")
    checked = checked_prompts(model, tokens)
    target = PromptSet(tokens, dataclasses.replace(checked.spec, tokenizer="smollm2"))
    source = PromptSet(tokens, dataclasses.replace(checked.spec, tokenizer="gemma3"))
    with pytest.raises(BadInputError, match="tokenized with"):
        patching.resid_pre_sweep(model, target, source, last_logit_gap)


@pytest.mark.parametrize("rows", [slice(0, 3), slice(4, 10), slice(9, 10)])
def test_select_keeps_only_what_the_metric_reads_with_the_same_numbers(model, tokens, rows):
    """``select`` narrows each read activation as it is captured (a pass then holds a few query rows
    of every pattern, not [layer, T, T]); the metric's values are those of the whole activations."""
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(3)]
    conditions = [[], [patching.Patch("blocks.1.hook_resid_pre", 0.0, position=2)]]
    seen_shapes = []

    def narrowed(acts):
        seen_shapes.extend(a.shape[2] for a in acts.values())
        return torch.stack([acts[n].sum() if n in acts else torch.tensor(-1.0) for n in names])

    def whole(acts):
        return torch.stack([acts[n][:, :, rows].sum() if n in acts else torch.tensor(-1.0) for n in names])

    got = patching.run_patches(model, tokens, conditions, narrowed, read=names, select=lambda a: a[:, :, rows],
                               progress=False)
    expected = patching.run_patches(model, tokens, conditions, whole, read=names, progress=False)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)  # the same cells, summed in another order
    assert set(seen_shapes) == {rows.stop - rows.start}
