"""The position-0 audit, leakage and the published numbers take bad arguments as the core does: a
``BadInputError`` naming the argument and what to pass, never a Python exception from inside; an
input measured on another model is refused."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lens_position.analyses.leakage import positional_leakage
from lens_position.analyses.massive import massive_activations, massive_intervention
from lens_position.analyses.published import published_beside_ours
from lens_position.analyses.sink_origin import sink_origin
from lens_position.core.data import build_prompts
from lens_position.core.intervals import NO_INTERVALS
from lens_position.core.position_check import check_positions
from lens_position.ground.errors import BadInputError
from lens_position.models import load_model

T = 16


@pytest.fixture(scope="module")
def prompts(tiny_llama):
    return build_prompts(tiny_llama, T=T, N=4, source="random")


@pytest.mark.fault(area="position-0 audit", given="sink_origin(moved_to=2.5) or sink_origin(T=1)",
                   happens="BadInputError naming moved_to (a whole number) or T (at least 3 for bos_moved)")
def test_sink_origin_names_the_argument_that_is_wrong(tiny_llama):
    with pytest.raises(BadInputError, match="moved_to must be an integer"):
        sink_origin(tiny_llama, T=T, N=2, moved_to=2.5, bootstrap=NO_INTERVALS, progress=False)
    with pytest.raises(BadInputError, match=r"T = 1: .*use T >= 3"):
        sink_origin(tiny_llama, T=1, N=2, bootstrap=NO_INTERVALS, progress=False)


@pytest.mark.fault(area="position-0 audit", given="massive_intervention entries outside the prompts, not pairs, or "
                                                  "massive= that is not a MassiveActivations",
                   happens="BadInputError before any pass, naming the entry and the ranges that fit")
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=st.one_of(
    st.just("1,3"), st.just([]), st.just([(1,)]), st.just([("a", 2)]), st.just([(0.5, 1)]),
    st.lists(st.tuples(st.integers(-5, 200), st.integers(-5, 200)), min_size=1, max_size=3).filter(
        lambda pairs: any(not (0 <= p < T and 0 <= d < 64) for p, d in pairs))))
def test_massive_intervention_refuses_entries_that_do_not_fit_the_prompts(tiny_llama, prompts, entries):
    with pytest.raises(BadInputError, match="entr"):
        massive_intervention(tiny_llama, prompts, layer=0, entries=entries, bootstrap=NO_INTERVALS, progress=False)


def test_massive_intervention_refuses_a_massive_of_another_type_or_another_model(tiny_llama, prompts):
    with pytest.raises(BadInputError, match="MassiveActivations"):
        massive_intervention(tiny_llama, prompts, massive="x", progress=False)
    other = load_model("tiny-qwen2")
    measured = massive_activations(other, build_prompts(other, T=T, N=4, source="random"), bootstrap=NO_INTERVALS,
                                   progress=False)
    with pytest.raises(BadInputError, match="measured on tiny-qwen2"):
        massive_intervention(tiny_llama, prompts, massive=measured, bootstrap=NO_INTERVALS, progress=False)


def test_position_ids_that_are_not_numbers_fail_the_check_by_name(tiny_llama, prompts):
    for bad in ("abc", torch.zeros(4, T) + 0.5, object()):
        with pytest.raises(BadInputError, match="position_ids must be whole numbers"):
            check_positions(tiny_llama, prompts, position_ids=bad)
    assert check_positions(tiny_llama, prompts, position_ids=torch.arange(T)).ok


@pytest.mark.parametrize("seed", [-1, 2.5, "7"])
def test_leakage_refuses_a_seed_out_of_range(tiny_llama, seed):
    with pytest.raises(BadInputError, match="seed"):
        positional_leakage(tiny_llama, seed=seed, progress=False)


def test_published_numbers_name_the_columns_a_table_lacks():
    heads = pd.DataFrame({"layer": [0], "head": [0], "significant": [True], "leakage_gap": [0.1],
                          "leakage_gap_lo": [0.0], "leakage_gap_hi": [0.2]})
    with pytest.raises(BadInputError, match=r"lacks the column\(s\) model: add the model's name"):
        published_beside_ours({"leakage_heads": heads})
    rates = pd.DataFrame({"model": ["m"], "condition": ["natural"], "N": [4], "sink_rate": [0.5],
                          "sink_rate_lo": [0.4], "sink_rate_hi": [0.6]})
    with pytest.raises(BadInputError, match="seq_len: rerun the step"):
        published_beside_ours({"sink_rate": rates})
    assert len(published_beside_ours({"sink_rate": rates.assign(seq_len=64)}))
