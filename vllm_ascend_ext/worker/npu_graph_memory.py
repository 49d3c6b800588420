"""Decode-graph memory in the NPU worker's KV budget.

vLLM's GPU worker measures the memory its graphs will take (``profile_cudagraph_memory``:
it captures the first two graphs of each mode into a temporary pool, extrapolates to all
capture sizes, and clears them) and takes that from the KV cache budget, but only on CUDA
and XPU (``gpu_worker.determine_available_memory``). On the NPU worker the graphs would
be captured after the KV cache had taken their memory. The NPU worker asks the runner for
the same estimate after vLLM's profiling and applies it as vLLM does:

* only when graphs are captured and the budget was measured (not with
  ``--kv-cache-memory-bytes``, where vLLM measures nothing either);
* ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0`` keeps the estimate out of the budget
  (measured and logged, as vLLM does);
* the estimate is kept as ``worker.cudagraph_memory_estimate``, which the warm-up compares
  with the memory the real capture took (``worker/npu_warmup.py``).

``apply_estimate`` is the pure arithmetic; ``budget`` runs the measurement.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm.config import CUDAGraphMode
from vllm.logger import init_logger

from vllm_ascend_ext.errors import AscendExtError

logger = init_logger("vllm.ascend_ext")


@dataclass(frozen=True)
class GraphBudget:
    available: int          # KV cache bytes after the graphs' share
    peak_activation: int    # the worker's peak activation memory, graphs included
    applied: int            # bytes taken from the KV budget for graphs


def captures_graphs(vllm_config) -> bool:
    comp = vllm_config.compilation_config
    return (not vllm_config.model_config.enforce_eager
            and comp.cudagraph_mode not in (None, CUDAGraphMode.NONE))


def apply_estimate(available: int, peak_activation: int, estimate: int, *,
                   enabled: bool) -> GraphBudget:
    """The KV budget with ``estimate`` bytes of graph memory taken out (when enabled)."""
    if estimate < 0:
        raise ValueError(f"graph memory estimate {estimate} < 0")
    applied = estimate if enabled else 0
    if available - applied <= 0:
        raise AscendExtError(
            f"decode graphs need about {estimate / 2**30:.2f} GiB, more than the "
            f"{available / 2**30:.2f} GiB left for the KV cache: raise "
            "--gpu-memory-utilization, capture fewer sizes (--max-cudagraph-capture-size), "
            "or serve with --enforce-eager")
    return GraphBudget(available - applied, peak_activation + applied, applied)


def budget(worker, available: int) -> int:
    """``available`` (vLLM's KV budget) less the decode graphs' memory; records the
    estimate on the worker."""
    import vllm.envs as envs

    if worker.cache_config.kv_cache_memory_bytes or not captures_graphs(worker.vllm_config):
        return available
    # vLLM's estimate is capture-time free-memory deltas; a device whose free memory rose
    # during capture (another process freed some) would give a negative figure.
    estimate = max(0, int(worker.model_runner.profile_cudagraph_memory()))
    worker.cudagraph_memory_estimate = estimate
    enabled = bool(envs.VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS)
    result = apply_estimate(available, getattr(worker, "peak_activation_memory", 0), estimate,
                            enabled=enabled)
    before = getattr(worker, "available_kv_cache_memory_bytes", available)
    worker.kv_budget_before_graphs = before
    worker.available_kv_cache_memory_bytes = before - result.applied
    worker.peak_activation_memory = result.peak_activation
    logger.info("ascend_ext: decode graphs estimated at %.2f MiB, %s the KV cache budget "
                "(now %.2f GiB)", estimate / 2**20,
                "taken from" if enabled else
                "NOT taken from (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0)",
                result.available / 2**30)
    return result.available
