"""Device and precision options, exercised on the CPU: dtype paths end to end, and the device
and GPU-request logic with the CUDA facts given explicitly (there is no GPU in CI)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lens_position.ground.errors import BadInputError
from lens_position.pipeline.config import Compute
from lens_position.pipeline.devices import place, resolve_device
from lens_position.pipeline.models import load_request
from lens_position.pipeline.ray_executor import RayExecutor


def test_auto_picks_cuda_only_when_torch_sees_a_gpu():
    assert resolve_device("auto", cuda_available=False) == "cpu"
    assert resolve_device("auto", cuda_available=True, cuda_count=1) == "cuda"
    assert resolve_device("cpu", cuda_available=True, cuda_count=8) == "cpu"


@pytest.mark.fault(area="options", given="--device cuda where torch sees no GPU, or --n-devices above the GPUs seen",
                   happens="refused before any model is loaded: BadInputError saying what to pass instead")
def test_cuda_without_a_gpu_or_too_few_gpus_is_refused():
    with pytest.raises(BadInputError, match="no CUDA GPU"):
        resolve_device("cuda", cuda_available=False)
    with pytest.raises(BadInputError, match="only 2 GPU"):
        resolve_device("cuda", cuda_available=True, cuda_count=2, n_devices=4)
    with pytest.raises(BadInputError, match="--device cuda"):
        Compute(device="cpu", n_devices=2)
    with pytest.raises(BadInputError, match="dtype"):
        Compute(dtype="float8")


class _FakeRay:
    def __init__(self, gpus: float):
        self.gpus = gpus

    def cluster_resources(self) -> dict:
        return {"CPU": 16.0, "GPU": self.gpus} if self.gpus else {"CPU": 16.0}


def test_ray_actors_ask_for_gpus_exactly_when_models_run_on_cuda():
    executor = RayExecutor()
    assert executor._gpus(_FakeRay(8), Compute(device="cuda", n_devices=2)) == 2
    assert executor._gpus(_FakeRay(8), Compute(device="auto")) == 1
    assert executor._gpus(_FakeRay(0), Compute(device="auto")) == 0
    assert executor._gpus(_FakeRay(8), Compute(device="cpu")) == 0


class _FakeModel(torch.nn.Module):
    """Stands in for a HookedTransformer: records TransformerLens's multi-GPU placement call."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.cfg = type("Cfg", (), {"dtype": torch.float32, "device": "cpu", "n_devices": 1})()
        self.moved = False

    def move_model_modules_to_device(self):
        self.moved = (self.cfg.n_devices, self.cfg.device)


def test_a_model_split_over_gpus_uses_transformer_lens_placement_and_keeps_the_dtype_in_its_config():
    model = place(_FakeModel(), device="cuda", dtype="bfloat16", n_devices=2)
    assert model.moved == (2, "cuda")
    assert model.linear.weight.dtype == torch.bfloat16 and model.cfg.dtype == torch.bfloat16
    single = place(_FakeModel(), device="cpu", dtype="float16")
    assert single.moved is False and single.linear.weight.dtype == torch.float16


def test_a_bfloat16_model_decomposes_with_float64_statistics_close_to_float32():
    from lens_position.analyses.decompose import decompose
    from lens_position.core.data import build_prompts

    full = load_request("tiny-llama", Compute())
    half = load_request("tiny-llama", Compute(dtype="bfloat16"))
    assert next(half.model.parameters()).dtype == torch.bfloat16
    assert next(full.model.parameters()).dtype == torch.float32
    prompts = build_prompts(full, source="random", T=24, N=4, bos="force", seed=0)
    a = decompose(full, prompts).layers
    b = decompose(half, prompts).layers
    assert a["total"].dtype == np.float64 and b["total"].dtype == np.float64
    assert not np.array_equal(a["total"].to_numpy(), b["total"].to_numpy())  # the dtype did reach the forward pass
    assert np.allclose(a["total"].to_numpy(), b["total"].to_numpy(), rtol=0.1, atol=0.02)


def test_the_dtype_is_part_of_a_steps_cache_key_and_the_thread_count_is_not(tmp_path):
    from lens_position.pipeline.config import RunConfig
    from lens_position.pipeline.plan import plan_run

    spec = load_request("tiny-llama").spec
    keys = {}
    for name, compute in {"f32": Compute(), "bf16": Compute(dtype="bfloat16"), "1thread": Compute(threads=1)}.items():
        plan = plan_run(RunConfig(out=tmp_path, models=("tiny-llama",), quick=True, steps=("decompose",),
                                  compute=compute))
        keys[name] = plan.cells_for_model("tiny-llama", spec, 0)[0].key
    assert keys["f32"] != keys["bf16"]
    assert keys["f32"] == keys["1thread"]
