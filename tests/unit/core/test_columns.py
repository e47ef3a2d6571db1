"""The column registry (lens_position.core.columns) documents every column of every result
table, and no column shadows a pandas attribute."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
from all_results import results

from lens_position.core.columns import COLUMNS, PANDAS_NAME_EXCEPTIONS, describe, recommended_first, undocumented

NAMES = list(results())


def _tables(name):
    result = results()[name]
    return {f.name: getattr(result, f.name) for f in dataclasses.fields(result)
            if isinstance(getattr(result, f.name), pd.DataFrame)}


@pytest.mark.parametrize("name", NAMES)
def test_every_column_of_every_result_table_is_documented(name):
    """By the shared registry, or by the result's own tables (``Table.columns``)."""
    tables = getattr(results()[name], "TABLES", ())
    declared = {column: doc for table in tables for column, doc in table.columns.items()}
    for table, frame in _tables(name).items():
        assert undocumented(frame.columns, declared) == [], f"{name}.{table}"


@pytest.mark.parametrize("name", NAMES)
def test_no_column_is_named_like_a_pandas_attribute(name):
    for table, frame in _tables(name).items():
        clashes = [c for c in frame.columns if hasattr(pd.DataFrame, c) and c not in PANDAS_NAME_EXCEPTIONS]
        assert clashes == [], f"{name}.{table}: {clashes} shadow DataFrame attributes"


def test_an_interval_column_is_described_by_its_estimate():
    assert "R_rf_heldout" in describe("R_rf_heldout_lo") and describe("R_rf_heldout_lo").startswith("lower")
    assert describe("not_a_column") is None and describe("not_a_column_hi") is None


def test_the_registry_describes_the_splits_it_names():
    assert "held out, reference-free" in COLUMNS["R_rf_heldout"]
    assert "in-sample, self-referenced" in COLUMNS["R"]
    assert "T" not in COLUMNS


def test_recommended_first_keeps_every_column_once():
    frame = pd.DataFrame(columns=["n_pairs", "R", "R_rf_heldout_hi", "layer", "R_rf_heldout", "R_rf_heldout_lo"])
    ordered = recommended_first(frame)
    assert list(ordered.columns) == ["layer", "R_rf_heldout", "R_rf_heldout_lo", "R_rf_heldout_hi", "n_pairs", "R"]


def test_the_column_reference_page_is_generated_from_the_registry():
    import importlib.util
    from pathlib import Path

    hook = Path(__file__).resolve().parents[3] / "docs" / "hooks" / "generated_tables.py"
    spec = importlib.util.spec_from_file_location("generated_tables", hook)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    page = module.column_reference()
    for column in COLUMNS:
        assert f"| `{column}`" in page
    assert page.index("`R_rf_heldout`") < page.index("`R`")
