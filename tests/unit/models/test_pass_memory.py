"""A forward pass whose attention cannot fit its device is refused before it runs, with the memory
it needs, what the device has and what would fit; one that may not fit is warned about.

Marked ``tl4``: the check sits in both backends, so it runs on TransformerLens 3.9 and 4.3."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lens_position.models.pass_memory as pass_memory
from lens_position.analyses.decompose import decompose
from lens_position.analyses.length_sweep import length_sweep
from lens_position.core.data import build_prompts
from lens_position.core.intervals import NO_INTERVALS
from lens_position.ground.errors import ContextLengthError, ResourceError
from lens_position.ground.memory import host_available_bytes
from lens_position.models import load_model
from lens_position.models.backends import hooked_available
from lens_position.models.pass_memory import (
    FLOOR_TENSORS,
    TYPICAL_TENSORS,
    MemoryWarning,
    attention_bytes,
    longest_fitting_T,
    pass_memory_problem,
)

pytestmark = pytest.mark.tl4

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
BACKENDS = ["bridge"] + (["hooked"] if hooked_available() else [])


@settings(max_examples=300, deadline=None)
@given(batch=st.integers(1, 64), T=st.integers(1, 1 << 17), heads=st.integers(1, 128), dtype=st.sampled_from(DTYPES),
       available=st.one_of(st.none(), st.integers(0, 1 << 42)))
def test_a_pass_is_refused_exactly_when_its_scores_and_softmax_cannot_fit(batch, T, heads, dtype, available):
    problem = pass_memory_problem(batch, T, heads, dtype, available)
    one = batch * heads * T * T * torch.empty((), dtype=dtype).element_size()
    assert attention_bytes(batch, heads, T, dtype) == one
    if available is None or TYPICAL_TENSORS * one <= available:
        assert problem is None
        return
    level, message = problem
    assert level == ("refuse" if FLOOR_TENSORS * one > available else "warn")
    assert f"{batch} sequence" in message and f"{T} positions" in message and f"{heads} heads" in message
    assert ("batch_size=1" in message) == (batch > 1)
    fits = longest_fitting_T(available, heads, dtype)
    assert (f"at most T = {fits} " in message) == (fits < T)
    # the length it offers keeps a pass's typical peak (one sequence) within the memory; one more would not
    assert TYPICAL_TENSORS * attention_bytes(1, heads, fits, dtype) <= available
    assert TYPICAL_TENSORS * attention_bytes(1, heads, fits + 1, dtype) > available
    assert message.endswith("or a machine or GPU with more memory")


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_boundaries_are_exact(dtype):
    one = attention_bytes(2, 3, 1000, dtype)
    assert pass_memory_problem(2, 1000, 3, dtype, FLOOR_TENSORS * one - 1)[0] == "refuse"
    assert pass_memory_problem(2, 1000, 3, dtype, FLOOR_TENSORS * one)[0] == "warn"
    assert pass_memory_problem(2, 1000, 3, dtype, TYPICAL_TENSORS * one - 1)[0] == "warn"
    assert pass_memory_problem(2, 1000, 3, dtype, TYPICAL_TENSORS * one) is None


def _files(tmp_path: Path, meminfo: str, limit: str | None = None, usage: str = "0", stat: str = "") -> dict:
    (tmp_path / "meminfo").write_text(meminfo)
    cgroup = (tmp_path / "max", tmp_path / "current", tmp_path / "stat")
    if limit is not None:
        cgroup[0].write_text(limit)
        cgroup[1].write_text(usage)
        cgroup[2].write_text(stat)
    return dict(meminfo=tmp_path / "meminfo", cgroups=(cgroup,))


def test_host_memory_is_what_the_kernel_and_the_cgroup_leave(tmp_path):
    meminfo = "MemTotal:  1000 kB\nMemFree:  10 kB\nMemAvailable:  600 kB\nSwapFree:  100 kB\n"
    assert host_available_bytes(**_files(tmp_path, meminfo)) == 700 * 1024
    assert host_available_bytes(**_files(tmp_path, meminfo, limit="max", usage="5")) == 700 * 1024
    # a job limit of 500 kB with 400 kB used, 150 kB of it page cache the kernel can drop
    assert host_available_bytes(**_files(tmp_path, meminfo, limit=str(500 * 1024), usage=str(400 * 1024),
                                         stat=f"anon 1\nfile {150 * 1024}\n")) == 250 * 1024
    assert host_available_bytes(**_files(tmp_path, meminfo, limit="100", usage="300")) == 0
    assert host_available_bytes(**_files(tmp_path, "MemTotal: 1000 kB\n")) is None  # no MemAvailable
    assert host_available_bytes(meminfo=tmp_path / "absent", cgroups=()) is None


@settings(max_examples=200, deadline=None)
@given(meminfo=st.text(max_size=200), limit=st.one_of(st.none(), st.text(max_size=30)), usage=st.text(max_size=30),
       stat=st.text(max_size=80))
def test_unexpected_memory_files_say_unknown_or_a_size_never_raise(tmp_path_factory, meminfo, limit, usage, stat):
    files = _files(tmp_path_factory.mktemp("memory"), meminfo, limit, usage, stat)
    available = host_available_bytes(**files)
    assert available is None or isinstance(available, int) and available >= 0


def test_this_machines_memory_is_read():
    meminfo = Path("/proc/meminfo")
    if not meminfo.exists():
        pytest.skip("not Linux: the host's memory is not read, and no pass is checked")
    fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in meminfo.read_text().splitlines()}
    available = host_available_bytes()
    assert available is not None and 0 < available <= fields["MemTotal"] + fields.get("SwapTotal", 0)


@pytest.fixture
def small_device(monkeypatch):
    """Every pass is checked, on a device with 1 MiB available."""
    monkeypatch.setattr(pass_memory, "CHECKED_FROM_BYTES", 0)
    monkeypatch.setattr(pass_memory, "available_bytes", lambda device: 1 << 20)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_pass_that_cannot_fit_is_refused_before_it_starts(backend, small_device):
    loaded = load_model("tiny-llama", backend=backend)
    tokens = build_prompts(loaded, N=2, T=256, source="random", seed=0).tokens  # 2 x 4 x 256² x 4 B = 2 MiB
    embedded = []
    loaded.model.embed.register_forward_pre_hook(lambda *_: embedded.append(1))
    with pytest.raises(ResourceError, match=r"2 sequences of 256 positions.*batch_size=1.*at most T = 128 "):
        loaded.backend.forward(tokens, return_type=None)
    if backend == "hooked":
        with pytest.raises(ResourceError, match="cannot run here"):
            loaded.backend.run_with_cache(tokens, ["blocks.0.attn.hook_pattern"])
    with pytest.raises(ResourceError, match="1 sequence of 256 positions"):  # the analyses' door
        decompose(loaded, build_prompts(loaded, N=2, T=256, source="random", seed=0), batch_size=1,
                  bootstrap=NO_INTERVALS, progress=False)
    with pytest.raises(ResourceError, match="1 sequence of 256 positions"):  # the longest length, before any
        length_sweep(loaded, (32, 256), N=2, batch_size=1, source="random", bootstrap=NO_INTERVALS, progress=False)
    assert not embedded  # no pass started
    with pytest.raises(ContextLengthError):  # longer than the context: that is the reason given
        loaded.backend.forward(torch.zeros(1, loaded.spec.n_ctx + 1, dtype=torch.long), return_type=None)


def test_a_decomposition_that_cannot_fit_is_refused_before_its_design_is_built(small_device, monkeypatch):
    """The pair design grows with T² as the pass does: a length no pass can hold is refused before it."""
    from lens_position.analyses.engine import design

    built = []
    real = design.PairDesign.build
    monkeypatch.setattr(design.PairDesign, "build", staticmethod(lambda *a, **k: built.append(1) or real(*a, **k)))
    loaded = load_model("tiny-llama")
    with pytest.raises(ResourceError, match="1 sequence of 256 positions"):
        decompose(loaded, build_prompts(loaded, N=2, T=256, source="random", seed=0), bootstrap=NO_INTERVALS,
                  progress=False)
    assert built == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_pass_that_may_not_fit_is_warned_about_and_runs(backend, monkeypatch):
    loaded = load_model("tiny-llama", backend=backend)
    tokens = build_prompts(loaded, N=1, T=128, source="random", seed=0).tokens  # 4 x 128² x 4 B = 256 kiB
    monkeypatch.setattr(pass_memory, "CHECKED_FROM_BYTES", 0)
    monkeypatch.setattr(pass_memory, "available_bytes", lambda device: 3 * attention_bytes(1, 4, 128, torch.float32))
    with pytest.warns(MemoryWarning, match="may need about"):
        out = loaded.backend.forward(tokens, stop_at_layer=loaded.spec.n_layers, return_type=None)
    assert out.shape == (1, 128, loaded.spec.d_model)
    monkeypatch.setattr(pass_memory, "available_bytes", lambda device: None)  # unknown: not checked
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded.backend.forward(tokens, return_type=None)
