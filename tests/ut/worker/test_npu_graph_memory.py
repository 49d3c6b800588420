"""Decode-graph memory in the NPU worker's KV budget (worker/npu_graph_memory.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from vllm.config import CUDAGraphMode

from vllm_ascend_ext.errors import AscendExtError
from vllm_ascend_ext.worker import npu_graph_memory as gm

MiB = 1 << 20


def test_the_estimate_comes_out_of_the_kv_budget_and_into_the_peak():
    b = gm.apply_estimate(1000 * MiB, 300 * MiB, 40 * MiB, enabled=True)
    assert (b.available, b.peak_activation, b.applied) == (960 * MiB, 340 * MiB, 40 * MiB)
    off = gm.apply_estimate(1000 * MiB, 300 * MiB, 40 * MiB, enabled=False)
    assert (off.available, off.peak_activation, off.applied) == (1000 * MiB, 300 * MiB, 0)


def test_graphs_larger_than_the_budget_are_refused_with_the_ways_out():
    with pytest.raises(AscendExtError, match=r"decode graphs need about 1\.00 GiB, more than "
                                             r"the 0\.50 GiB left .*--enforce-eager"):
        gm.apply_estimate(512 * MiB, 0, 1024 * MiB, enabled=True)
    with pytest.raises(ValueError, match="< 0"):
        gm.apply_estimate(512 * MiB, 0, -1, enabled=True)


def _worker(estimate, *, kv_bytes=None, eager=False, mode=CUDAGraphMode.FULL_DECODE_ONLY):
    calls = []

    def profile():
        calls.append(1)
        return estimate
    cfg = SimpleNamespace(model_config=SimpleNamespace(enforce_eager=eager),
                          compilation_config=SimpleNamespace(cudagraph_mode=mode))
    return SimpleNamespace(vllm_config=cfg, cache_config=SimpleNamespace(kv_cache_memory_bytes=kv_bytes),
                           model_runner=SimpleNamespace(profile_cudagraph_memory=profile),
                           available_kv_cache_memory_bytes=800 * MiB,
                           peak_activation_memory=100 * MiB, calls=calls)


def test_budget_measures_and_records_what_vllms_worker_would_on_cuda(monkeypatch):
    import vllm.envs as envs

    monkeypatch.setattr(envs, "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", True)
    w = _worker(24 * MiB)
    assert gm.budget(w, 800 * MiB) == 776 * MiB and w.calls == [1]
    assert w.cudagraph_memory_estimate == 24 * MiB
    assert (w.available_kv_cache_memory_bytes, w.peak_activation_memory) == (776 * MiB, 124 * MiB)
    assert w.kv_budget_before_graphs == 800 * MiB
    monkeypatch.setattr(envs, "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", False)
    w = _worker(24 * MiB)
    assert gm.budget(w, 800 * MiB) == 800 * MiB and w.cudagraph_memory_estimate == 24 * MiB


@pytest.mark.parametrize("over", [dict(kv_bytes=1 << 30), dict(eager=True),
                                  dict(mode=CUDAGraphMode.NONE)])
def test_no_measurement_without_graphs_or_with_a_fixed_kv_size(over):
    w = _worker(24 * MiB, **over)
    assert gm.budget(w, 800 * MiB) == 800 * MiB and w.calls == []
    assert not hasattr(w, "cudagraph_memory_estimate")


def test_a_negative_measurement_counts_as_none():
    w = _worker(-3 * MiB)
    assert gm.budget(w, 800 * MiB) == 800 * MiB and w.cudagraph_memory_estimate == 0
