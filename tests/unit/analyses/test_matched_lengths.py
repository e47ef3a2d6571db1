"""Comparisons across architectures are made at one sequence length T, never across lengths.

The mask component shrinks with T on every model, so a comparison of two models decomposed at
different T measures T. The claims read every cross-model comparison (C2 across architectures,
C3's differences and depth slopes) through ``claims.matched``: the models' own decompositions
when they share T, else the length sweep's rows at a common T, else the comparison is
inconclusive with that reason. These tests feed the claims' inputs with lengths that match, that
do not, and that a length sweep reconciles, and check every decided comparison rests on one T.
"""

from __future__ import annotations

import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lens_position.analyses import claims
from lens_position.analyses.claims import FAILS, HOLDS, INCONCLUSIVE, claims_table, matched
from tests.helpers.fake_results import fake_results, with_length_sweep

STD, NTK, SWA = "standard RoPE: std", "NTK-scaled RoPE: ntk", "sliding window: swa"
_BASE = fake_results()  # the hand-made tables, all decomposed at T = 128


def _tables(T: dict[str, int]) -> dict[str, pd.DataFrame]:
    """The hand-made tables with each role's decomposition recorded at ``T[role]``."""
    tables = {name: frame.copy() for name, frame in _BASE.items()}
    tables["decompose_layers"]["seq_len"] = tables["decompose_layers"]["role"].map(T)
    return tables


def _row(table: pd.DataFrame, claim: str, arch: str) -> pd.Series:
    return table[(table["claim"] == claim) & (table["architecture"] == arch)].iloc[0]


def test_matched_lengths_are_compared_as_before():
    table = claims_table(_tables({"standard": 128, "ntk": 128, "sliding": 128}))
    for claim in ("C2", "C3"):
        assert _row(table, claim, "overall")["verdict"] == HOLDS
    assert set(table.loc[table["claim"] == "C2", "seq_len"].dropna()) == {128}
    assert "at T = 128" in _row(table, "C3", NTK)["measured"]


def test_a_comparison_across_lengths_is_inconclusive_and_says_why():
    """The sliding model at T = 640, the others at 128 and no length sweep: nothing compares the
    sliding model with the standard one, C2 is decided nowhere, and both say it is T."""
    table = claims_table(_tables({"standard": 128, "ntk": 128, "sliding": 640}))
    swa = _row(table, "C3", SWA)
    assert swa["verdict"] == INCONCLUSIVE
    assert "different T measures T" in swa["explanation"] and "T = 640" in swa["explanation"]
    assert _row(table, "C3", NTK)["verdict"] == HOLDS  # NTK and standard share T = 128
    for arch in (STD, NTK, SWA):
        row = _row(table, "C2", arch)
        assert row["verdict"] == INCONCLUSIVE and "no common T" in row["explanation"]
    assert _row(table, "C2", "overall")["verdict"] == INCONCLUSIVE


def test_a_length_sweep_supplies_the_common_length():
    """With a sweep at 128 and 1024 on every model, C2 is decided at 128 (the shortest own T) and
    the window comparison at 1024 (beyond the window of 512), each said in the text."""
    tables = with_length_sweep(_tables({"standard": 128, "ntk": 128, "sliding": 640}),
                               {role: (128, 1024) for role in ("standard", "ntk", "sliding")}, window={"sliding": 512})
    table = claims_table(tables)
    c2 = table[(table["claim"] == "C2") & (table["architecture"] != "overall")]
    assert set(c2["seq_len"]) == {128} and (c2["verdict"] == HOLDS).all()
    assert "at its own T = 640" in _row(table, "C2", SWA)["measured"]
    swa = _row(table, "C3", SWA)
    assert swa["verdict"] == HOLDS
    assert "depth slope of R' minus that of standard RoPE: std at T = 1024 (length sweep, N = 16)" in swa["measured"]


def test_a_window_question_needs_a_length_beyond_the_window():
    """A sweep that stops at the window (512) cannot ask whether the window lets R' accumulate."""
    tables = with_length_sweep(_tables({"standard": 128, "ntk": 128, "sliding": 640}),
                               {role: (128, 512) for role in ("standard", "ntk", "sliding")}, window={"sliding": 512})
    swa = _row(claims_table(tables), "C3", SWA)
    assert swa["verdict"] == INCONCLUSIVE
    assert "longer than the window (512)" in swa["explanation"]


_LENGTHS = st.sampled_from([32, 128, 512, 640, 1024])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(own=st.fixed_dictionaries({r: _LENGTHS for r in ("standard", "ntk", "sliding")}),
       swept=st.fixed_dictionaries({r: st.sets(_LENGTHS, max_size=3) for r in ("standard", "ntk", "sliding")}),
       window=st.sampled_from([None, 16, 512]))
def test_no_decided_comparison_rests_on_two_lengths(own, swept, window):
    """Whatever lengths the decompositions and the sweeps have: every comparison the claims decide
    reads decompositions of one T (longer than the window for a window question), and every C2
    verdict of a run is decided at the same T on all architectures, or not at all."""
    tables = with_length_sweep(_tables(own), {r: tuple(sorted(v)) for r, v in swept.items()},
                               window=None if window is None else {"sliding": window})
    archs = [STD, NTK, SWA]
    for pair in ([STD, NTK], [STD, SWA], [NTK, SWA], archs):
        for beyond in (None, window):
            at = matched(tables, pair, beyond=beyond)
            if at.T is None:
                assert at.reason.startswith("not compared")
                continue
            assert set(at.summaries) == set(pair)
            assert {claims._length(s) for s in at.summaries.values()} == {at.T}
            assert beyond is None or at.T > beyond
    table = claims_table(tables)
    decided = table[(table["claim"] == "C2") & table["verdict"].isin([HOLDS, FAILS])
                    & (table["architecture"] != "overall")]
    assert decided["seq_len"].nunique() <= 1
    if len(decided):
        c2 = table[(table["claim"] == "C2") & (table["architecture"] != "overall")]
        assert c2["seq_len"].nunique() == 1  # the undecided ones too: all judged at that T
    balances = [claims._balance(tables, arch, role) for arch, role in claims._architectures(tables)]
    for parts in claims._c3_parts(tables, [b for b in balances if b is not None]).values():
        for part in parts:
            if part.verdict in (HOLDS, FAILS):
                assert part.T is not None and f"T = {part.T}" in part.at
                if "slope" in part.text and window is not None:
                    assert part.T > window
            if part.T is None:
                assert part.verdict == INCONCLUSIVE
