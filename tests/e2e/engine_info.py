"""What an engine ran: its worker, model runner, device runtime and decode graphs.

Every emulated e2e script reports this in its RESULT line (``"engine"``), and
``conftest.run_script`` asserts that an emulated run took the NPU engine path (the
plugin's NPU worker and runner on the CPU stand-in), not vLLM's CPU worker.
"""

from __future__ import annotations


def _fia_task_keys() -> list[int]:
    """Graph keys held by every live FiaGraphTasks (profiling captures must leave none)."""
    import gc

    from vllm_ascend_ext.attention.fia.graph_tasks import FiaGraphTasks

    gc.unfreeze()     # the warm-up froze the heap: frozen objects are not listed
    return sorted(len(o.tasks) for o in gc.get_objects() if type(o) is FiaGraphTasks)


def captured_graphs(model) -> list:
    """The decode graphs a model runner's graph wrapper captured (none when eager)."""
    entries = getattr(model, "concrete_cudagraph_entries", {}) or {}
    return [e.cudagraph for e in entries.values() if e.cudagraph is not None]


def engine_info(llm) -> dict:
    worker = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker
    runner = worker.model_runner
    from vllm_ascend_ext.worker import npu_device

    runtime = npu_device.current_runtime()
    graphs = captured_graphs(runner.model)
    comp = llm.llm_engine.vllm_config.compilation_config
    return {"worker": type(worker).__name__, "runner": type(runner).__name__,
            "runtime": getattr(runtime, "__stand_in__", None) if runtime is not None else None,
            "graph_wrapper": type(runner.model).__name__,
            "cudagraph_mode": comp.cudagraph_mode.name,
            "graphs_captured": len(graphs),
            "graph_replays": sum(getattr(g, "replays", 0) for g in graphs),
            "fia_task_updates": sum(t.updates for g in graphs
                                    for t in (g.tasks() if hasattr(g, "tasks") else ())),
            "fia_task_keys": _fia_task_keys(),
            "graph_memory_estimate": getattr(worker, "cudagraph_memory_estimate", None),
            "kv_cache_bytes": getattr(worker, "available_kv_cache_memory_bytes", None),
            "kv_budget_before_graphs": getattr(worker, "kv_budget_before_graphs", None),
            "kv_cache_memory_bytes": llm.llm_engine.vllm_config.cache_config.kv_cache_memory_bytes,
            # what the NPU platform chooses (vLLM's CPU platform would turn async off)
            "async_scheduling": llm.llm_engine.vllm_config.scheduler_config.async_scheduling,
            "block_size": llm.llm_engine.vllm_config.cache_config.block_size,
            "top_k_top_p_fused": getattr(runner.sampler.topk_topp_sampler, "fused_calls", None)}
