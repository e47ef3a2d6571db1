"""Regression tests of the five classes of bad input, one example each (the classes themselves are
covered by tests/unit/core/test_bad_input_properties.py): non-finite numbers stop the stream where
they appear; no verdict from an interval that cannot exist; saved results prove what they are;
the output folder is owned; files are read and browsers started safely."""

from __future__ import annotations

import json
import math
import os
import pickle
import stat
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from lens_position.analyses.bos import bos_replacement
from lens_position.analyses.claims import INCONCLUSIVE, at_least
from lens_position.analyses.compare import compare, decompose_conditions
from lens_position.analyses.decompose import Decomposition, decompose
from lens_position.analyses.sinks import sink_heads
from lens_position.core.intervals import MIN_INTERVAL_UNITS, NO_INTERVALS, from_replicates
from lens_position.core.patch import Patch
from lens_position.core.results import load_result
from lens_position.ground.errors import BadInputError, CorruptFileError, LensPositionError, NonFiniteError
from lens_position.models.load import load_model
from lens_position.models.spec import as_loaded
from lens_position.models.toy import offset_only_model, random_model
from lens_position.models.zoo.train import read_resume
from lens_position.pipeline.outputs import OutputFolder
from lens_position.pipeline.ray_executor import check_ray_address

LENGTH = 16


def model_and_tokens(n: int = 6, seed: int = 0):
    loaded = random_model(n_layers=2, d_vocab=50)
    tokens = torch.randint(1, 50, (n, LENGTH), generator=torch.Generator().manual_seed(seed))
    return loaded, tokens


# --------------------------------------------------------------------------- 1. non-finite numbers


@pytest.mark.fault(area="non-finite numbers", given="NaN in one head's W_Q (layer 1, head 2)",
                   happens="NonFiniteError naming layer 1, head 2, the prompt and the likely cause (no table "
                           "with NaN cells, no layer mean over the other heads)")
def test_nan_in_one_heads_query_weights_is_named_by_layer_and_head():
    loaded, tokens = model_and_tokens()
    with torch.no_grad():
        loaded.model.blocks[1].attn.W_Q[2, 0, 0] = float("nan")
    for analysis in (lambda: decompose(loaded, tokens, progress=False),
                     lambda: sink_heads(loaded, tokens, progress=False)):
        with pytest.raises(NonFiniteError, match=r"layer 1, head 2, prompt 0.*non-finite weights"):
            analysis()


@pytest.mark.fault(area="non-finite numbers", given="inf in one key/value head's W_K",
                   happens="NonFiniteError naming the layer and head, not 'the attention mask is not the "
                           "causal key set'")
def test_inf_in_key_weights_is_a_non_finite_error_not_a_mask_error():
    loaded, tokens = model_and_tokens()
    with torch.no_grad():
        loaded.model.blocks[0].attn._W_K[1, 0, 0] = float("inf")  # grouped: key/value head 1 = query heads 2, 3
    with pytest.raises(NonFiniteError, match=r"layer 0, head [23]"):
        decompose(loaded, tokens, progress=False)


@pytest.mark.fault(area="non-finite numbers", given="a NaN embedding row that only one prompt's token reaches",
                   happens="NonFiniteError naming that prompt (and position), not all-NaN tables")
def test_a_nan_embedding_row_names_the_prompt_that_reached_it():
    loaded, tokens = model_and_tokens()
    token = int(tokens[3, 5])
    tokens[tokens == token] = (token % 49) + 1 if token != 49 else 1  # only prompt 3 holds it ...
    tokens[3, 5] = token  # ... at position 5
    with torch.no_grad():
        loaded.model.embed.W_E[token] = float("nan")
    with pytest.raises(NonFiniteError, match=r"prompt 3, position 5"):
        decompose(loaded, tokens, progress=False)


@pytest.mark.fault(area="non-finite numbers", given="a NaN or infinite patch value",
                   happens="NonFiniteError when the Patch is built, before any pass")
@pytest.mark.parametrize("value", [float("nan"), torch.tensor([0.0, float("inf")]), torch.full((3, 4), float("nan"))])
def test_non_finite_patch_values_are_refused_when_built(value):
    with pytest.raises(NonFiniteError, match="NaN or infinite"):
        Patch("hook_embed", value, position=0)


@pytest.mark.fault(area="non-finite numbers", given="a head whose attention pattern is NaN (TransformerLens "
                   "writes it as zeros)", happens="NonFiniteError at hook_pattern, not a sink score of 0.0")
def test_a_nan_pattern_is_not_a_sink_score_of_zero():
    loaded, tokens = model_and_tokens()
    with torch.no_grad():
        loaded.model.blocks[1].attn.W_Q[0] = float("nan")
    with pytest.raises(NonFiniteError, match=r"hook_(pattern|attn_scores) \(layer 1, head 0"):
        sink_heads(loaded, tokens, progress=False)


@pytest.mark.fault(area="model options", given="ntk_alpha = inf, NaN, 0 or huge; n_ctx = 2.7; window 0 or 1.5; "
                   "a NaN NTK-by-parts factor", happens="BadInputError before the model is built (nothing rounded)")
@pytest.mark.parametrize("options", [dict(ntk_alpha=math.inf), dict(ntk_alpha=math.nan), dict(ntk_alpha=0),
                                     dict(ntk_alpha=1e300), dict(n_ctx=2.7), dict(window=0), dict(window=1.5),
                                     dict(ntk_by_parts={"factor": math.nan}),
                                     dict(ntk_by_parts={"original_context": 2.5}), dict(ntk_by_parts="yes")])
def test_load_options_must_be_finite_and_in_range(options):
    with pytest.raises(BadInputError):
        load_model("tiny-llama", **options)


@pytest.mark.fault(area="sinks", given="eps outside [0, 1] (or NaN)", happens="BadInputError naming the range")
@pytest.mark.parametrize("eps", [-0.1, 1.5, math.nan, math.inf])
def test_sink_eps_must_lie_in_the_unit_interval(eps):
    loaded, tokens = model_and_tokens(4)
    with pytest.raises(BadInputError, match=r"\[0, 1\]"):
        sink_heads(loaded, tokens, eps=eps, progress=False)


# --------------------------------------------------------------------------- 2. degenerate sizes


@pytest.mark.fault(area="intervals and verdicts", given="N = 2 sequences (one per half)",
                   happens="no interval computed (NaN) and every verdict 'inconclusive at this N' (minimum N = 4)")
def test_too_few_sequences_give_no_interval_and_no_verdict():
    loaded, tokens = model_and_tokens(2)
    result = decompose(loaded, tokens, progress=False)
    assert result.heads[["R_lo", "R_hi", "total_heldout_lo"]].isna().all().all()
    assert result.replicates is None
    replicates = [0.5, 0.5, 0.5]  # a zero-width "interval" clearly above the threshold
    assert at_least(from_replicates(0.5, replicates, n=MIN_INTERVAL_UNITS - 1), 0.1) == INCONCLUSIVE
    assert at_least(from_replicates(0.5, replicates, n=MIN_INTERVAL_UNITS), 0.1) != INCONCLUSIVE


@pytest.mark.fault(area="query ranges", given="a query range holding only query 0",
                   happens="the same BadInputError from every analysis (query 0 sees only itself), not NaN "
                           "tables or 12 of 12 heads 'sinks'")
def test_a_query_range_of_query_zero_alone_is_refused_the_same_way_everywhere():
    loaded, tokens = model_and_tokens(4)
    tokens[:, 0] = loaded.spec.bos_token_id  # BOS replacement needs BOS at position 0
    messages = set()
    for analysis in (lambda: decompose(loaded, tokens, query_range=(0, 1), progress=False),
                     lambda: decompose(loaded, tokens, query_range=(0, 1), keys="no-bos", progress=False),
                     lambda: sink_heads(loaded, tokens, query_range=(0, 1), progress=False),
                     lambda: bos_replacement(loaded, tokens, query_range=(0, 1), progress=False)):
        with pytest.raises(BadInputError, match="holds only query 0") as error:
            analysis()
        messages.add(str(error.value))
    assert len(messages) == 1


# --------------------------------------------------------------------------- 3. results prove what they are


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    loaded, tokens = model_and_tokens(4)
    folder = tmp_path_factory.mktemp("saved") / "decomposition"
    decompose(loaded, tokens, bootstrap=NO_INTERVALS, progress=False).save(folder)
    return folder


def copy_of(saved: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(saved, tmp_path / "copy"))


@pytest.mark.fault(area="saved results", given="a saved result whose table was edited (R x 10)",
                   happens="CorruptFileError naming the table: its sha256 no longer matches the manifest")
def test_an_edited_table_is_refused_on_load(saved, tmp_path):
    folder = copy_of(saved, tmp_path)
    heads = pd.read_parquet(folder / "heads.parquet")
    heads["R"] *= 10
    heads.to_parquet(folder / "heads.parquet")
    with pytest.raises(CorruptFileError, match=r"heads\.parquet has changed"):
        load_result(folder)
    assert isinstance(load_result(saved), Decomposition)  # the untouched copy loads


@pytest.mark.fault(area="saved results", given="a truncated, empty, re-encoded or foreign file in a saved result",
                   happens="CorruptFileError naming the file (never a raw pyarrow / json / safetensors error)")
@pytest.mark.parametrize("damage", ["truncate table", "empty table", "empty manifest", "manifest not JSON",
                                    "manifest latin-1", "foreign manifest", "foreign type", "missing table"])
def test_every_damaged_file_is_a_corrupt_file_error_naming_it(saved, tmp_path, damage):
    folder = copy_of(saved, tmp_path)
    table, manifest = folder / "heads.parquet", folder / "result.json"
    if damage == "truncate table":
        table.write_bytes(table.read_bytes()[:100])
    elif damage == "empty table":
        table.write_bytes(b"")
    elif damage == "empty manifest":
        manifest.write_text("")
    elif damage == "manifest not JSON":
        manifest.write_text("{ this is not json")
    elif damage == "manifest latin-1":
        manifest.write_bytes(manifest.read_text().replace("heads", "h\u00e9ads").encode("latin-1"))
    elif damage == "foreign manifest":
        manifest.write_text(json.dumps({"name": "my-package", "version": "1.0"}))
    elif damage == "foreign type":
        record = json.loads(manifest.read_text())
        record["type"] = "lens_position.core.results.load_result"
        manifest.write_text(json.dumps(record))
    else:
        table.unlink()
    with pytest.raises(CorruptFileError) as error:
        load_result(folder)
    assert str(folder) in str(error.value)


@pytest.mark.fault(area="compare", given="a base and a condition from different models, or different prompts",
                   happens="BadInputError: a paired comparison needs the same weights (sha256) and token ids")
def test_compare_refuses_a_base_and_a_condition_of_other_weights_or_prompts():
    loaded, tokens = model_and_tokens(4)
    other_model = random_model(n_layers=2, d_vocab=50, seed=1)
    base = decompose(loaded, tokens, bootstrap=NO_INTERVALS, progress=False)
    with pytest.raises(BadInputError, match="model weights"):
        compare(base, {"other model": decompose(other_model, tokens, bootstrap=NO_INTERVALS, progress=False)})
    shuffled = tokens.flip(0)
    with pytest.raises(BadInputError, match="prompts"):
        compare(base, {"other prompts": decompose(loaded, shuffled, bootstrap=NO_INTERVALS, progress=False)})
    same = decompose(loaded, tokens, bootstrap=NO_INTERVALS, progress=False)
    assert compare(base, {"same": same}).overall["fraction_removed"].iloc[0] == pytest.approx(0.0, abs=1e-12)


@pytest.mark.fault(area="provenance", given="a model edited or cast in place after it was loaded",
                   happens="the provenance hashes the weights as the analysis ran them and records the dtype")
def test_provenance_states_the_weights_and_dtype_the_analysis_ran():
    loaded, tokens = model_and_tokens(4)
    before = decompose(loaded, tokens, bootstrap=NO_INTERVALS, progress=False).provenance["model"]
    with torch.no_grad():
        loaded.model.blocks[0].attn.W_Q[0, 0, 0] += 1.0
    after = decompose(loaded, tokens, bootstrap=NO_INTERVALS, progress=False).provenance["model"]
    assert after["weights_sha256"] != before["weights_sha256"]
    assert after["extra"]["weights_sha256_at_load"] == before["weights_sha256"]
    assert before["extra"]["dtype"] == "float32"
    loaded.model.to(torch.float64)
    cast = as_loaded(loaded).spec
    assert cast.extra["dtype"] == "float64" and cast.weights_sha256 != after["weights_sha256"]


@pytest.mark.fault(area="compare", given="bos_replacement(...) or compare(...) with intervals off (n_resamples=0)",
                   happens="each row's condition column names its own condition (it read 'R_heldout_change')")
def test_conditions_keep_their_names_with_intervals_off():
    loaded = offset_only_model(bos_bonus=2.0, n_layers=2)
    from lens_position.models.toy import toy_tokens

    tokens = toy_tokens(4, 24, bos=True)
    base = decompose(loaded, tokens, bootstrap=NO_INTERVALS, progress=False)
    own = loaded.model.W_E.detach()[tokens[:, 0]]
    conditions = decompose_conditions(loaded, tokens, {"self": [Patch("hook_embed", own, position=0)],
                                                       "mean": [Patch("hook_embed", own.mean(0), position=0)]},
                                      bootstrap=NO_INTERVALS)
    comparison = compare(base, conditions)
    for frame in (comparison.heads, comparison.layers, comparison.overall):
        assert set(frame["condition"]) == {"self", "mean"}
    replaced = bos_replacement(loaded, tokens, query_range=(0, 16), bootstrap=NO_INTERVALS, progress=False)
    for frame in (replaced.frame, replaced.overall, replaced.heads):
        assert set(frame["replacement"]) == {"token", "mean", "random"}


# --------------------------------------------------------------------------- 4. the output folder


KNOWN = {"report.png", "decompose_heads.parquet", "report.html"}


@pytest.mark.fault(area="output folder", given="--out naming a folder of the user's own files (report.png, tables)",
                   happens="refused (exit 1) unless --force; with --force the user's files are kept")
def test_a_folder_of_the_users_files_is_refused_and_kept_with_force(tmp_path):
    (tmp_path / "report.png").write_bytes(b"my picture")
    (tmp_path / "decompose_heads.parquet").write_bytes(b"my table")
    with pytest.raises(BadInputError, match="--force"):
        OutputFolder(tmp_path, KNOWN)
    with OutputFolder(tmp_path, KNOWN, force=True) as folder:
        folder.text("report", "report.html", "<html></html>")
        folder.finish({})
    assert (tmp_path / "report.png").read_bytes() == b"my picture"
    assert (tmp_path / "decompose_heads.parquet").read_bytes() == b"my table"


def test_only_files_a_previous_manifest_lists_are_removed(tmp_path):
    with OutputFolder(tmp_path, KNOWN) as folder:
        folder.text("report", "report.html", "first")
        folder.file("shot", "report.png", lambda p: p.write_bytes(b"shot"))
        folder.finish({})
    (tmp_path / "decompose_heads.parquet").write_bytes(b"the user's, added later")
    with OutputFolder(tmp_path, KNOWN) as folder:
        folder.text("report", "report.html", "second")
        folder.finish({})
    assert not (tmp_path / "report.png").exists()  # the earlier run's, listed in its manifest
    assert (tmp_path / "decompose_heads.parquet").read_bytes() == b"the user's, added later"
    assert (tmp_path / "report.html").read_text() == "second"


@pytest.mark.fault(area="output folder", given="two runs into one folder at the same time",
                   happens="the second is refused (the folder's lock), not silently replacing the first")
def test_a_second_run_into_a_folder_in_use_is_refused(tmp_path):
    with OutputFolder(tmp_path / "out", KNOWN):
        with pytest.raises(BadInputError, match="another run"):
            OutputFolder(tmp_path / "out", KNOWN)
    OutputFolder(tmp_path / "out", KNOWN).close()  # released when the first is done


@pytest.mark.fault(area="output folder", given="--out '' (the empty path)", happens="refused, not the current folder")
def test_the_empty_path_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BadInputError, match="empty path"):
        OutputFolder("", KNOWN)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.fault(area="output folder", given="a run under umask 022", happens="outputs are 0644 (they were 0600)")
def test_outputs_get_the_users_umask(tmp_path):
    old = os.umask(0o022)
    try:
        with OutputFolder(tmp_path / "out", KNOWN) as folder:
            path = folder.text("report", "report.html", "x")
            folder.finish({})
        loaded, tokens = model_and_tokens(4)
        saved = decompose(loaded, tokens, bootstrap=NO_INTERVALS, progress=False).save(tmp_path / "result")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "out" / "provenance.json").stat().st_mode) == 0o644
    assert stat.S_IMODE(saved.stat().st_mode) == 0o755


# --------------------------------------------------------------------------- 5. unsafe edges


class _Planted:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "code ran"))


@pytest.mark.fault(area="zoo", given="a resume file holding a planted pickle",
                   happens="CorruptFileError (read with weights_only=True); the pickle's code never runs")
def test_a_planted_pickle_in_a_resume_file_does_not_run(tmp_path):
    marker = tmp_path / "marker"
    resume = tmp_path / "rope-seed0.resume.pt"
    torch.save({"recipe_sha256": "x", "step": 0, "parameters": {}, "optimizer": {}, "curve": [],
                "seconds": 0.0, "payload": _Planted(marker)}, resume, pickle_protocol=pickle.HIGHEST_PROTOCOL)
    with pytest.raises(CorruptFileError, match="resume"):
        read_resume(resume)
    assert not marker.exists()


def test_an_honest_resume_file_reads_back(tmp_path):
    resume = tmp_path / "ok.resume.pt"
    state = {"recipe_sha256": "x", "step": 3, "parameters": {"w": torch.ones(2)}, "optimizer": {"state": {}},
             "curve": [{"step": 3, "held_out_bits": 1.5}], "seconds": 2.0}
    torch.save(state, resume)
    assert read_resume(resume)["curve"] == state["curve"]


@pytest.mark.fault(area="ray", given="--ray-address where nothing listens",
                   happens="BadInputError within seconds (it retried forever)")
def test_a_ray_address_where_nothing_listens_fails_within_seconds():
    import socket

    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        with pytest.raises(BadInputError, match="no Ray cluster answers"):
            check_ray_address(address, timeout_s=3)
    assert time.monotonic() - started < 10


def test_local_ray_binds_the_loopback(monkeypatch):
    import sys
    import types

    from lens_position.pipeline import ray_executor

    seen = {}
    fake = types.SimpleNamespace(init=lambda **kwargs: seen.update(kwargs))
    monkeypatch.setitem(sys.modules, "ray", fake)
    ray_executor.start_local_ray(num_cpus=1)
    assert seen["_node_ip_address"] == "127.0.0.1"


def test_every_error_here_is_the_packages():
    assert issubclass(NonFiniteError, BadInputError) and issubclass(CorruptFileError, LensPositionError)
