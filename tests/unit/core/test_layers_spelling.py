"""Layers are written the same way in Python and on the command line: "2:6" is range(2, 6),
"0,6" (and the tuple (0, 6)) is the two layers 0 and 6."""

from __future__ import annotations

import argparse

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lens_position.cli.commands import _layer_list
from lens_position.core.checks import check_layers, parse_layers
from lens_position.ground.errors import BadInputError


def test_a_range_and_a_list_mean_the_same_in_python_and_on_the_command_line():
    assert check_layers("0:6", 30) == list(range(6)) == list(_layer_list("0:6"))
    assert check_layers("0,6", 30) == [0, 6] == check_layers((0, 6), 30) == list(_layer_list("0,6"))
    assert check_layers("0,2:4", 30) == [0, 2, 3]


@given(st.lists(st.integers(0, 40), min_size=1, max_size=6), st.integers(0, 40), st.integers(1, 10))
def test_any_mix_of_indices_and_ranges_parses_to_their_union(indices, start, width):
    text = ",".join(map(str, indices)) + f",{start}:{start + width}"
    assert parse_layers(text) == sorted({*indices, *range(start, start + width)})
    assert list(_layer_list(text)) == parse_layers(text)


@pytest.mark.parametrize("text", ["", "a", "1:b", "-1", "3:1", ","])
def test_bad_spellings_are_refused_the_same_way(text):
    with pytest.raises(BadInputError, match="layer indices"):
        check_layers(text, 30)
    with pytest.raises(argparse.ArgumentTypeError, match="layer indices"):
        _layer_list(text)


def test_a_layer_beyond_the_model_is_refused():
    with pytest.raises(BadInputError, match="out of range"):
        check_layers("28:32", 30)
