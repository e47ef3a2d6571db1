"""C3 at every sequence length: each comparison made at every T both sides were measured at, from
the same numbers the claims table decides on at its one T, and never across lengths."""

from __future__ import annotations

import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lens_position.analyses.claims import BY_LENGTH_COLUMNS, FAILS, HOLDS, c3_by_length, claims_table
from tests.helpers.fake_results import fake_results, with_length_sweep

STD, NTK, SWA = "standard RoPE: std", "NTK-scaled RoPE: ntk", "sliding window: swa"
_BASE = fake_results()  # every role decomposed at T = 128


def _swept(lengths: dict[str, tuple[int, ...]], window: int = 512) -> dict[str, pd.DataFrame]:
    tables = {name: frame.copy() for name, frame in _BASE.items()}
    tables["decompose_layers"]["seq_len"] = 128
    return with_length_sweep(tables, lengths, window={"sliding": window})


def _ntk_raised_at_2048() -> dict[str, pd.DataFrame]:
    """Every role swept at 128, 1024 and 2048, NTK's residual share raised tenfold at 2048 only."""
    tables = _swept({role: (128, 1024, 2048) for role in ("standard", "ntk", "sliding")})
    for name in ("length_sweep_layers", "length_sweep_replicates"):
        frame = tables[name].copy()
        at = (frame["role"] == "ntk") & (frame["seq_len"] == 2048)
        frame.loc[at, "R_rf_heldout"] = frame.loc[at, "R_rf_heldout"] * 10 + 0.5
        tables[name] = frame
    return tables


def test_every_common_length_gets_its_comparison_and_the_windowed_ones_only_beyond_the_window():
    tables = _swept({role: (128, 1024, 2048) for role in ("standard", "ntk", "sliding")})
    table = c3_by_length(tables)
    assert list(table.columns) == BY_LENGTH_COLUMNS
    ntk = table[table["architecture"] == NTK]
    assert sorted(ntk["seq_len"]) == [128, 1024, 2048] and set(ntk["versus"]) == {STD}
    swa = table[table["architecture"] == SWA]
    assert sorted(set(swa["seq_len"])) == [1024, 2048]  # the window is 512
    assert sorted(swa["versus"].unique()) == ["", STD]  # its own slope, and its slope against the standard one
    assert set(table["verdict"]) == {HOLDS}


def test_at_the_claims_own_length_the_verdict_and_value_are_the_claims_tables():
    tables = _swept({role: (128, 1024) for role in ("standard", "ntk", "sliding")})
    claims = claims_table(tables)
    row = claims[(claims["claim"] == "C3") & (claims["architecture"] == NTK)].iloc[0]
    mine = c3_by_length(tables)
    at = mine[(mine["architecture"] == NTK) & (mine["seq_len"] == row["seq_len"])].iloc[0]
    assert at["verdict"] == row["verdict"]
    assert at["value"] == row["value"] and at["value_lo"] == row["value_lo"] and at["value_hi"] == row["value_hi"]


def test_a_verdict_that_changes_with_T_is_shown_at_each_T():
    """NTK's residual share raised tenfold at T = 2048 only: the comparison holds at 128 and 1024
    and fails at 2048, where NTK scaling acts beyond the standard model's range in this table."""
    tables = _ntk_raised_at_2048()
    ntk = c3_by_length(tables).query("architecture == @NTK").set_index("seq_len")["verdict"]
    assert ntk.to_dict() == {128: HOLDS, 1024: HOLDS, 2048: FAILS}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.fixed_dictionaries({role: st.sets(st.sampled_from([64, 128, 256, 512, 1024, 4096]), max_size=4)
                                      for role in ("standard", "ntk", "sliding")}),
       window=st.sampled_from([64, 256, 512, 2048]))
def test_no_comparison_is_made_across_lengths_or_inside_the_window(lengths, window):
    tables = _swept({role: tuple(sorted(ts)) for role, ts in lengths.items()}, window=window)
    table = c3_by_length(tables)
    measured = {role: set(ts) | {128} for role, ts in lengths.items()}  # 128: their own decompositions
    arch_role = {STD: "standard", NTK: "ntk", SWA: "sliding"}
    for row in table.itertuples():
        T = int(row.seq_len)
        assert T in measured[arch_role[row.architecture]]
        if row.versus:
            assert T in measured[arch_role[row.versus]]
        if row.architecture == SWA:
            assert T > window
    expected_ntk = sorted(measured["ntk"] & measured["standard"])
    assert sorted(table.loc[table["architecture"] == NTK, "seq_len"]) == expected_ntk


def test_without_an_ntk_or_windowed_model_the_table_is_empty():
    tables = {name: frame[frame["role"] == "standard"] if "role" in frame.columns else frame
              for name, frame in _BASE.items()}
    assert c3_by_length(tables).empty


def test_the_report_says_at_which_T_each_verdict_holds():
    from lens_position.report.html import build_report

    tables = _ntk_raised_at_2048()
    page = build_report(tables)
    section = page[page.index('<section id="c3-by-length">'):]
    section = section[:section.index("</section>")]
    assert f"{NTK}: R&#x27;/(R&#x27;+M&#x27;) minus the standard model&#x27;s against {STD}: holds at T = 128, " \
           "1024; fails at T = 2048" in section
    assert section.count("<tr>") == 1 + len(c3_by_length(tables))
    assert page.index('id="figure-length_sweep"') < page.index('id="c3-by-length"')


def test_no_section_without_a_comparison():
    from lens_position.findings import Findings
    from lens_position.report.by_length import by_length_html

    tables = {name: frame[frame["role"] == "standard"] if "role" in frame.columns else frame
              for name, frame in _BASE.items()}
    assert by_length_html(Findings.of(tables).by_length) == ""
