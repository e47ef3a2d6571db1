"""The benchmarks send no packet: each tiny invocation, and the ones that load the embedded SmolLM2,
in a counting network namespace (a file of their own: they take minutes, and a file runs on one test
worker; the rest of the no-packet checks are in test_no_internal_error.py)."""

from __future__ import annotations

import pytest
from test_no_internal_error import BENCHMARKS, REAL_MODEL_BENCHMARKS, _assert_benchmarks_send_no_packet


@pytest.mark.fault(area="network", given="the benchmarks' tiny invocations (decompose, gpu, patching, backends, "
                                         "probe_intervals, reproduce on tiny-llama)",
                   happens="no packet leaves for a non-loopback address")
def test_the_benchmarks_send_no_packet(tmp_path):
    _assert_benchmarks_send_no_packet(BENCHMARKS)


@pytest.mark.slow
@pytest.mark.fault(area="network", given="the benchmarks that load SmolLM2-135M (load, decompose_real)",
                   happens="no packet leaves for a non-loopback address")
def test_the_real_model_benchmarks_send_no_packet(tmp_path):
    _assert_benchmarks_send_no_packet(REAL_MODEL_BENCHMARKS)
