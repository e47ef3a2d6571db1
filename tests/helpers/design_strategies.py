"""A hypothesis strategy for the key sets a decomposition builds: a length, a sliding window or none,
a range of queries and whether key 0 is analysed."""

from __future__ import annotations

from hypothesis import strategies as st


@st.composite
def key_set_shapes(draw, min_length: int = 2, max_length: int = 80, min_window: int = 1, min_queries: int = 1):
    """``(length, window, query_start, query_stop, keys)`` for ``PairDesign.build``."""
    length = draw(st.integers(max(min_length, min_queries), max_length))
    window = draw(st.one_of(st.none(), st.integers(min_window, length + 3)))
    start = draw(st.integers(0, length - min_queries))
    stop = draw(st.integers(start + min_queries, length))
    keys = draw(st.sampled_from(["all", "no-bos"]))
    return length, window, start, stop, keys
