"""Results are files: every result object saves to a folder and loads back as the same object."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import pkgutil

import numpy as np
import pandas as pd
import pytest
import torch

import lens_position
from lens_position.analyses.decompose import Decomposition, decompose
from lens_position.analyses.sinks import SinkHeads
from lens_position.core.results import MANIFEST, SavedResult, load_result
from lens_position.ground.errors import BadInputError


def _result_classes() -> list[type]:
    """Every dataclass of the analysis modules that carries a ``provenance``: the result objects
    an analysis function returns (the reproduction pipeline's own records write themselves)."""
    found = []
    for info in pkgutil.walk_packages(lens_position.__path__, prefix="lens_position."):
        if info.name.startswith(("lens_position.pipeline",)):
            continue
        module = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if obj.__module__ == module.__name__ and dataclasses.is_dataclass(obj) \
                    and "provenance" in {f.name for f in dataclasses.fields(obj)}:
                found.append(obj)
    return found


RESULT_CLASSES = _result_classes()


def _example(cls: type) -> SavedResult:
    """An instance with a value of the declared kind in every field."""
    values = {}
    for i, f in enumerate(dataclasses.fields(cls)):
        kind = str(f.type)
        if "DataFrame" in kind:
            values[f.name] = pd.DataFrame({"layer": [0, 0, 3], "head": [0, 1, 2], "value": [0.5, np.nan, -1.0 * i],
                                           "label": ["a", "b", None], "window": pd.array([16, None, 16], "Int64")})
        elif "Tensor" in kind:
            values[f.name] = torch.arange(6, dtype=torch.float32).reshape(2, 3) + i
        elif kind.startswith("list[tuple"):
            values[f.name] = [(0, 1), (3, 2)]
        elif kind.startswith("dict"):
            values[f.name] = {"model": {"name": "tiny", "attn_types": ["local", "global"]}, "seed": 0,
                              "options": {"query_range": [0, 32]}}
        elif kind == "float":
            values[f.name] = 0.3
        elif kind == "int":
            values[f.name] = 7
        else:
            values[f.name] = f"value {i}"
    return cls(**values)


def _assert_same(a, b):
    assert type(a) is type(b)
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, pd.DataFrame):
            pd.testing.assert_frame_equal(x, y)
        elif isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and torch.equal(x, y), f.name
        else:
            assert x == y, f.name


def test_every_result_class_can_be_saved():
    assert len(RESULT_CLASSES) >= 9, [c.__name__ for c in RESULT_CLASSES]
    not_saved = [c.__name__ for c in RESULT_CLASSES if not issubclass(c, SavedResult)]
    assert not not_saved, f"result classes without save/load: {not_saved}"


@pytest.mark.parametrize("cls", RESULT_CLASSES, ids=lambda c: c.__name__)
def test_saved_result_loads_back_as_the_same_object(cls, tmp_path):
    result = _example(cls)
    folder = result.save(tmp_path / "saved")
    again = cls.load(folder)
    _assert_same(result, again)
    _assert_same(result, load_result(folder))
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["type"].endswith(cls.__name__) and manifest["saved"]["versions"]["lens_position"]


def test_real_decomposition_round_trips_with_its_provenance(tiny_gemma3, tmp_path):
    tokens = torch.randint(3, 200, (4, 40), generator=torch.Generator().manual_seed(0))
    result = decompose(tiny_gemma3, tokens, layers=[0, 2, 5], progress=False)
    again = Decomposition.load(result.save(tmp_path / "decomposition"))
    pd.testing.assert_frame_equal(result.heads, again.heads)
    pd.testing.assert_frame_equal(result.layers, again.layers)
    assert again.provenance == json.loads(json.dumps(result.provenance))
    assert again.provenance["model"]["weights_sha256"] == tiny_gemma3.spec.weights_sha256


def test_to_tensor_is_indexed_by_real_layer_and_head(tiny_gemma3):
    tokens = torch.randint(3, 200, (4, 40), generator=torch.Generator().manual_seed(1))
    result = decompose(tiny_gemma3, tokens, layers=[0, 2, 5], progress=False)
    R = result.to_tensor("R")
    assert R.shape == (tiny_gemma3.spec.n_layers, tiny_gemma3.spec.n_heads)
    for row in result.heads.itertuples():
        assert R[row.layer, row.head].item() == pytest.approx(row.R, abs=0)
    assert torch.isnan(R[[1, 3, 4]]).all() and not torch.isnan(R[[0, 2, 5]]).any()
    with pytest.raises(BadInputError, match="no per-head quantity"):
        result.to_tensor("layer_type")


def test_load_refuses_a_result_of_another_type(tmp_path):
    folder = _example(SinkHeads).save(tmp_path / "sinks")
    with pytest.raises(BadInputError, match="holds a SinkHeads, not a Decomposition"):
        Decomposition.load(folder)


def test_save_never_replaces_a_folder_that_is_not_a_saved_result(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(BadInputError, match="does not hold a saved result"):
        _example(SinkHeads).save(tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    with pytest.raises(BadInputError, match="no saved result"):
        load_result(tmp_path / "mine")
