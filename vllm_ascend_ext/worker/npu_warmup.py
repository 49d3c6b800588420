"""The NPU worker's warm-up: compile sizes, decode-graph capture, the sampler's buffers.

vLLM's GPU worker warms up through ``kernel_warmup``, which tunes CUDA kernels (FlashInfer,
DeepGEMM, CuTe DSL, vLLM's Triton kernels for Qwen and Mamba) and imports CUDA-only model
code on the way (MiniMax-M3's, which needs torchvision): an NPU runs none of those
kernels. The NPU worker keeps, in vLLM's order:

1. a dummy run per compile size that no captured graph covers (``warmup_sizes``);
2. decode-graph capture (``capture_model``: the runner's graphs, FIA tasks captured),
   its memory logged beside the estimate the KV budget took (``worker/npu_graph_memory.py``);
3. the sampler's dummy run at the largest batch (buffers allocated after capture);
4. the seed reset, so serving's random state is the configured seed's;
5. the GC heap frozen, vLLM's GC debug callback and its sync check (``VLLM_GPU_SYNC_CHECK``)
   switched on.

Not kept: the KV-size suggestion and start-up plan written after profiling, the dummy
runs' randomised
inputs for data parallelism, and the JIT-compile monitor (Triton JIT).
"""

from __future__ import annotations

from vllm.config import CompilationMode, CUDAGraphMode
from vllm.distributed.parallel_state import get_pp_group
from vllm.logger import init_logger
from vllm.utils.gc_utils import freeze_gc_heap, maybe_attach_gc_debug_callback
from vllm.utils.gpu_sync_debug import enable_gpu_sync_check
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.worker.worker_base import CompilationTimes

logger = init_logger("vllm.ascend_ext")


def warmup_sizes(compile_sizes, capture_sizes, compile_range_ends, *, compiled: bool,
                 graphs: bool) -> list[int]:
    """Sizes to run once before serving, largest first: the compile sizes no captured
    graph covers, and each compile range's end where no size lies in that range
    (``compile_range_ends``: ``[(start, end), ...]``); none for an uncompiled model."""
    if not compiled:
        return []
    captured = set(capture_sizes or []) if graphs else set()
    sizes = [s for s in (compile_sizes or []) if isinstance(s, int) and s not in captured]
    known = captured | set(sizes)
    for start, end in compile_range_ends:
        if not any(start <= s <= end for s in known):
            sizes.append(end)
    return sorted(set(sizes), reverse=True)


def compile_or_warm_up(worker) -> CompilationTimes:
    runner, comp = worker.model_runner, worker.vllm_config.compilation_config
    from vllm.v1.worker.gpu.cudagraph_utils import has_compiled_submodule

    compiled = (comp.mode == CompilationMode.VLLM_COMPILE
                and has_compiled_submodule(runner.get_model()))
    ranges = [(r.start, r.end) for r in comp.get_compile_ranges()] if compiled else []
    for size in warmup_sizes(comp.compile_sizes, comp.cudagraph_capture_sizes, ranges,
                             compiled=compiled,
                             graphs=comp.cudagraph_mode != CUDAGraphMode.NONE):
        logger.info("ascend_ext: compile and warm-up run for %d tokens", size)
        runner._dummy_run(size, skip_eplb=True, remove_lora=False)
    runner.maybe_remove_all_loras(runner.lora_config)
    logger.info_once("ascend_ext: vLLM's CUDA kernel warm-up (kernel_warmup) is skipped on "
                     "the NPU: none of its kernels runs there")
    if not worker.model_config.enforce_eager:
        captured = runner.capture_model()
        estimate = getattr(worker, "cudagraph_memory_estimate", 0)
        if estimate:
            logger.info("ascend_ext: decode graphs took %.2f MiB (estimated %.2f MiB)",
                        (captured or 0) / 2**20, estimate / 2**20)
    if get_pp_group().is_last_rank:
        sched = worker.scheduler_config
        hidden, last_hidden = runner._dummy_run(
            num_tokens=min(sched.max_num_seqs, sched.max_num_batched_tokens),
            skip_eplb=True, cudagraph_runtime_mode=CUDAGraphMode.NONE)
        if runner.is_pooling_model:
            runner._dummy_pooler_run(hidden)
        else:
            runner._dummy_sampler_run(hidden_states=last_hidden)
    set_random_seed(worker.model_config.seed, worker.parallel_config.data_parallel_index)
    freeze_gc_heap()
    maybe_attach_gc_debug_callback()
    enable_gpu_sync_check()
    return CompilationTimes(language_model=comp.compilation_time,
                            encoder=comp.encoder_compilation_time)
