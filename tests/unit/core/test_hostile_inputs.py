"""A hostile but fair user's inputs, through the Python API, by the five classes of bad input: each
ends in the package's error with a message saying what to do, or in a finite, correct result. The
broad classes (bootstrap settings, positive numbers, handed-in sink scores, weights too large for
the normalisation) are drawn by hypothesis beside the examples."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lens_position.analyses.analyze import analyze
from lens_position.analyses.compare import compare
from lens_position.analyses.decompose import Decomposition, decompose
from lens_position.analyses.fingerprint import fingerprint
from lens_position.analyses.probes import position_probe
from lens_position.analyses.sinks import sink_heads
from lens_position.core.checks import check_positive
from lens_position.core.intervals import MAX_RESAMPLES, NO_INTERVALS, Bootstrap
from lens_position.core.results import load_result
from lens_position.ground.errors import BadInputError, CorruptFileError, LensPositionError, NonFiniteError
from lens_position.models.load import load_model
from lens_position.models.placement import check_device
from lens_position.models.toy import random_model
from lens_position.pipeline.config import Compute, DataOptions, RunConfig
from lens_position.pipeline.sweep import read_spec

VOCAB = 50
SETTINGS = settings(max_examples=30, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def tokens(n: int = 6, length: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, VOCAB, (n, length), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def model():
    return random_model(n_layers=2, d_vocab=VOCAB)


# --------------------------------------------------------------------------- 1. non-finite numbers


@pytest.mark.fault(area="non-finite numbers", given="an embedding scaled by 1e20 (finite weights, float32 or bfloat16)",
                   happens="NonFiniteError at the first normalisation's scale, naming activations too large for it "
                           "(x² overflowed, the norm handed the next layer zeros, and every head came out 'all "
                           "mask', R = 0, a table that looked right)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weights_too_large_for_the_normalisation_are_refused_not_read_as_uniform_attention(dtype):
    huge = random_model(n_layers=2, d_vocab=VOCAB)
    with torch.no_grad():
        huge.model.embed.W_E.mul_(1e20)
    huge.model.to(dtype)
    with pytest.raises(NonFiniteError, match=r"ln1\.hook_scale.*too large for the normalisation"):
        decompose(huge, tokens(), bootstrap=NO_INTERVALS, progress=False)


@settings(max_examples=8, deadline=None, derandomize=True)
@given(exponent=st.integers(0, 38))
def test_a_scaled_embedding_is_refused_or_leaves_layer_0_unchanged(exponent):
    """Property: layer 0 reads the embedding through a normalisation, so scaling the embedding by
    10^k changes none of its attention; either the result says so, or the scale overflowed and
    the run is refused."""
    base = random_model(n_layers=1, d_vocab=VOCAB)
    expected = decompose(base, tokens(), bootstrap=NO_INTERVALS, progress=False).heads
    with torch.no_grad():
        base.model.embed.W_E.mul_(10.0 ** exponent)
    try:
        got = decompose(base, tokens(), bootstrap=NO_INTERVALS, progress=False).heads
    except NonFiniteError:
        assert exponent >= 19  # float32 squares overflow from about 1.8e19
        return
    np.testing.assert_allclose(got[["R", "M", "total"]].to_numpy(), expected[["R", "M", "total"]].to_numpy(),
                               atol=1e-4)


@pytest.mark.fault(area="non-finite numbers", given="a NaN in one LayerNorm / RMSNorm weight",
                   happens="NonFiniteError naming the layer and the prompt")
def test_a_nan_in_one_norm_weight_is_named(model):
    poisoned = random_model(n_layers=2, d_vocab=VOCAB)
    with torch.no_grad():
        poisoned.model.blocks[1].ln1.w[3] = float("nan")
    with pytest.raises(NonFiniteError, match="layer 1"):
        decompose(poisoned, tokens(), bootstrap=NO_INTERVALS, progress=False)


scores_drawn = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([-0.5, 1.7, 100.0, float("nan"), float("inf")]),
)


@pytest.mark.fault(area="sinks", given="sink_heads(scores=...) holding NaN, a value outside [0, 1] (1.7, percentages, "
                   "logits), the wrong shape or not a float tensor",
                   happens="NonFiniteError / BadInputError naming the head or the shape (NaN gave a table with a "
                           "NaN score, 1.7 a 'sink' of 170%)")
@SETTINGS
@given(value=scores_drawn, layer=st.integers(0, 1), head=st.integers(0, 3), per_prompt=st.booleans())
def test_handed_in_sink_scores_are_refused_or_are_fractions(model, value, layer, head, per_prompt):
    prompts = tokens()
    scores = torch.full((len(prompts), 2, 4) if per_prompt else (2, 4), 0.25, dtype=torch.float64)
    scores[..., layer, head] = value
    try:
        result = sink_heads(model, prompts, scores=scores, bootstrap=NO_INTERVALS, progress=False)
    except LensPositionError as error:
        assert not (math.isfinite(value) and 0 <= value <= 1), error
        return
    assert math.isfinite(value) and -1e-3 <= value <= 1 + 1e-3
    assert np.isfinite(result.frame["sink_score"]).all()


@pytest.mark.parametrize("scores", [torch.rand(3, 4), torch.rand(2, 2, 4), torch.ones(2, 4, dtype=torch.int64),
                                    [[0.1] * 4] * 2])
def test_handed_in_sink_scores_of_the_wrong_shape_or_type_are_refused(model, scores):
    with pytest.raises(BadInputError, match="scores"):
        sink_heads(model, tokens(), scores=scores, bootstrap=NO_INTERVALS, progress=False)


@pytest.mark.fault(area="probes", given="position_probe(ridge=NaN, inf, 0 or -1); fingerprint(noise_tolerance=NaN, "
                   "0 or -1)",
                   happens="BadInputError 'must be a finite number > 0' (a raw linalg error from the probe; "
                           "with NaN every fingerprint spread was 'not float noise')")
@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0.0, -1.0, True, "1"])
def test_a_penalty_or_tolerance_must_be_a_positive_number(model, value):
    with pytest.raises(BadInputError, match="ridge"):
        position_probe(model, tokens(8, 16), ridge=value, bootstrap=NO_INTERVALS, progress=False)
    tiny = load_model("tiny-llama")
    with pytest.raises(BadInputError, match="noise_tolerance"):
        fingerprint(tiny, T=8, N=2, noise_tolerance=value, progress=False)


@SETTINGS
@given(value=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 5), st.booleans(),
                       st.text(max_size=3)))
def test_check_positive_returns_a_finite_positive_float_or_refuses(value):
    try:
        number = check_positive("x", value)
    except BadInputError:
        return
    assert isinstance(number, float) and math.isfinite(number) and number > 0


# --------------------------------------------------------------------------- 2. degenerate sizes


@pytest.mark.fault(area="intervals and verdicts", given="Bootstrap(n_resamples=50.5, '100', 10**12, -5), seed=-1 "
                   "or 2**64, level=NaN or True",
                   happens="BadInputError naming the setting and its range (a TypeError deep in numpy, a 32 TB "
                           "allocation, numpy's 'expected non-negative integer')")
@SETTINGS
@given(n_resamples=st.one_of(st.integers(-10, 10 ** 13), st.floats(allow_nan=True), st.sampled_from(["100", True])),
       level=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([True, "0.95"])),
       seed=st.one_of(st.integers(-2, 2 ** 65), st.floats(allow_nan=True)))
def test_bootstrap_settings_are_refused_or_usable(n_resamples, level, seed):
    try:
        bootstrap = Bootstrap(n_resamples=n_resamples, level=level, seed=seed)
    except BadInputError:
        return
    assert type(bootstrap.n_resamples) is int
    assert bootstrap.n_resamples == 0 or 20 <= bootstrap.n_resamples <= MAX_RESAMPLES
    assert 0 < bootstrap.level < 1 and type(bootstrap.seed) is int and 0 <= bootstrap.seed < 2 ** 63
    np.random.default_rng(bootstrap.seed)  # what the resampling does with it


def test_a_whole_float_number_of_resamples_is_taken_as_that_integer(model):
    result = decompose(model, tokens(), bootstrap=Bootstrap(n_resamples=20.0), progress=False)
    assert np.isfinite(result.layers["R_lo"]).all()


@pytest.mark.fault(area="query ranges", given="analyze(..., early_queries=1 or 0) on prompts without BOS",
                   happens="BadInputError ('holds only query 0' / 'selects no queries'), whether or not BOS "
                           "replacement runs (it was ignored without BOS)")
@pytest.mark.parametrize("early", [0, 1, -3, 2.5])
def test_early_queries_are_checked_at_the_door(model, early):
    with pytest.raises(BadInputError, match="early_queries"):
        analyze(model, tokens(), early_queries=early, bootstrap=NO_INTERVALS, progress=False)


def test_duplicate_layers_give_one_row_per_layer(model):
    result = decompose(model, tokens(), layers=(1, 1, 1), bootstrap=NO_INTERVALS, progress=False)
    assert result.layers["layer"].tolist() == [1]


@pytest.mark.fault(area="model options", given="load_model(device='tpu', 'cuda' without a GPU, 'cuda:7', 3)",
                   happens="BadInputError naming the device (torch's RuntimeError listing its device types)")
@pytest.mark.parametrize("device", ["tpu", "cuda:99", "gpu", 3, ""])
def test_a_device_torch_cannot_use_here_is_refused_before_loading(device):
    with pytest.raises(BadInputError, match="device"):
        load_model("tiny-llama", device=device)
    assert check_device("cpu") == "cpu"


@pytest.mark.fault(area="compute", given="Compute(threads=100000) (--threads 100000)",
                   happens="BadInputError naming the machine's cores ('can't start new thread', an internal error)")
def test_more_threads_than_the_machine_can_start_are_refused():
    with pytest.raises(BadInputError, match="CPU cores"):
        Compute(threads=100_000)
    assert Compute(threads=1).threads == 1


@pytest.mark.fault(area="compute", given="RunConfig(ray_address='') or a ray_address with the serial executor",
                   happens="BadInputError: names no cluster / needs --executor ray (an ActorDiedError, exit 3; "
                           "the address was ignored)")
@pytest.mark.parametrize("executor, address, match", [("ray", "", "names no cluster"),
                                                      ("ray", "  ", "names no cluster"),
                                                      ("serial", "localhost:1", "--executor ray"),
                                                      ("threads", None, "unknown executor")])
def test_a_ray_address_must_name_a_cluster_and_go_with_the_ray_executor(tmp_path, executor, address, match):
    with pytest.raises(BadInputError, match=match):
        RunConfig(out=tmp_path, executor=executor, ray_address=address)


@pytest.mark.fault(area="sweeps", given="a sweep spec with seeds = [-1] or 2**64, a spec path that is a folder",
                   happens="BadInputError naming the seed's range / 'is a folder' (numpy's 'expected non-negative "
                           "integer', exit 3; '[Errno 21] Is a directory')")
def test_a_sweep_spec_with_a_bad_seed_or_a_folder_is_refused(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text('models = ["tiny-llama"]\nseeds = [-1]\n')
    from lens_position.pipeline.sweep import sweep_config

    with pytest.raises(BadInputError, match="seed"):
        sweep_config(read_spec(spec), out=tmp_path / "out")
    with pytest.raises(BadInputError, match="is a folder"):
        read_spec(tmp_path)
    with pytest.raises(BadInputError, match="seed"):
        DataOptions(seed=2 ** 64)


@pytest.mark.fault(area="sweeps", given="a spec saved with a UTF-8 byte-order mark, or text = \"~/corpus.txt\"",
                   happens="read as written: the mark dropped, ~ expanded to the home folder (as in a model's path)")
def test_a_spec_with_a_byte_order_mark_and_a_home_relative_text_is_read_as_written(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    spec = tmp_path / "sweep.toml"
    spec.write_text('\ufeffmodels = ["tiny-llama"]\ntext = "~/corpus.txt"\n', encoding="utf-8")
    assert read_spec(spec)["text"] == str(tmp_path / "home" / "corpus.txt")


@pytest.mark.fault(area="sweeps", given="a spec whose grid is tens of thousands of runs",
                   happens="refused before planning: BadInputError with the count and the route (split the spec)")
@given(n_models=st.integers(1, 30), n_seeds=st.integers(1, 3000))
@SETTINGS
def test_a_sweep_grid_beyond_the_limit_is_refused_with_its_size(tmp_path, n_models, n_seeds):
    from lens_position.pipeline.sweep import MAX_RUNS

    spec = tmp_path / "grid.toml"
    models = ", ".join(f'"hub-org/model-{k}"' for k in range(n_models))
    spec.write_text(f"models = [{models}]\nseeds = {list(range(n_seeds))}\n")
    runs = n_models * n_seeds
    if runs > MAX_RUNS:
        with pytest.raises(BadInputError, match=f"{runs:,} runs"):
            read_spec(spec)
    else:
        assert len(read_spec(spec)["seeds"]) == n_seeds


# --------------------------------------------------------------------------- 3. results and files


@pytest.fixture
def two_saved(model, tmp_path):
    first = decompose(model, tokens(seed=0), bootstrap=NO_INTERVALS, progress=False).save(tmp_path / "first")
    second = decompose(model, tokens(seed=1), bootstrap=NO_INTERVALS, progress=False).save(tmp_path / "second")
    return first, second


@pytest.mark.fault(area="saved results", given="a saved result whose heads table was replaced by another result's "
                   "(same model, same columns)", happens="CorruptFileError: the file has changed since it was saved")
def test_a_table_from_another_result_is_refused(two_saved):
    first, second = two_saved
    shutil.copy(second / "heads.parquet", first / "heads.parquet")
    with pytest.raises(CorruptFileError, match="heads.parquet has changed"):
        Decomposition.load(first)


@pytest.mark.fault(area="saved results", given="a result saved by a newer version (a later result format)",
                   happens="refused with the route: upgrade lens_position to read it")
def test_a_result_from_a_newer_version_says_to_upgrade(two_saved):
    first, _ = two_saved
    manifest = json.loads((first / "result.json").read_text())
    manifest["format"] += 1
    (first / "result.json").write_text(json.dumps(manifest))
    with pytest.raises(BadInputError, match="newer lens_position.*upgrade"):
        load_result(first)


@pytest.mark.fault(area="saved results", given="a manifest that names a file outside its folder ('../other/"
                   "heads.parquet'), with that file's true hash",
                   happens="CorruptFileError: not a file of this folder (it would have read another result's table)")
def test_a_manifest_naming_a_file_outside_its_folder_is_refused(two_saved):
    first, second = two_saved
    manifest = json.loads((first / "result.json").read_text())
    manifest["frames"] = [f"../{second.name}/heads" if f == "heads" else f for f in manifest["frames"]]
    manifest["files"][f"../{second.name}/heads.parquet"] = manifest["files"].pop("heads.parquet")
    (first / "result.json").write_text(json.dumps(manifest))
    with pytest.raises(CorruptFileError, match="not a file of this folder"):
        load_result(first)


@pytest.mark.fault(area="compare", given="compare(base, {'x': 3}) or compare(3, {...})",
                   happens="BadInputError: must be a Decomposition (an AttributeError)")
def test_compare_refuses_what_is_not_a_decomposition(model):
    base = decompose(model, tokens(), bootstrap=NO_INTERVALS, progress=False)
    with pytest.raises(BadInputError, match="must be a Decomposition"):
        compare(base, {"x": 3})
    with pytest.raises(BadInputError, match="must be a Decomposition"):
        compare(3, {"x": base})
    with pytest.raises(BadInputError, match="mapping"):
        compare(base, [base])


def test_compare_across_two_models_saved_and_loaded_is_refused(model, tmp_path):
    other = random_model(n_layers=2, d_vocab=VOCAB, seed=7)
    base = Decomposition.load(decompose(model, tokens(), bootstrap=NO_INTERVALS, progress=False).save(tmp_path / "a"))
    cond = Decomposition.load(decompose(other, tokens(), bootstrap=NO_INTERVALS, progress=False).save(tmp_path / "b"))
    with pytest.raises(BadInputError, match="different model weights"):
        compare(base, {"other": cond})



@pytest.mark.fault(area="prompts", given="token ids as numpy uint64 / torch uint32 (values beyond int64 included)",
                   happens="taken as int64 when they fit; an id beyond int64 is refused as outside the vocabulary "
                           "(torch's NotImplementedError 'min_all not implemented for UInt64')")
def test_wide_unsigned_token_ids_are_checked_like_any_other(model):
    ids = tokens(4, 8)
    expected = decompose(model, ids, bootstrap=NO_INTERVALS, progress=False).heads["R"].to_numpy()
    got = decompose(model, ids.numpy().astype(np.uint64), bootstrap=NO_INTERVALS, progress=False).heads["R"]
    np.testing.assert_array_equal(got.to_numpy(), expected)
    with pytest.raises(BadInputError, match="vocabulary"):
        decompose(model, np.full((2, 8), 2 ** 63 + 5, dtype=np.uint64), bootstrap=NO_INTERVALS, progress=False)


@pytest.mark.fault(area="fingerprint", given="fingerprint(model, N=1)",
                   happens="BadInputError: the spread across inputs needs N >= 2 (one input has no spread, so "
                           "'identical across inputs' held by construction)")
def test_a_fingerprint_of_one_input_is_refused():
    with pytest.raises(BadInputError, match="at least 2 prompts"):
        fingerprint(load_model("tiny-llama"), T=8, N=1, progress=False)
