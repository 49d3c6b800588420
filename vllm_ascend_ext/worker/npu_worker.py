"""The NPU worker: vLLM's GPU worker with the device brought up through ``torch.npu``.

What it changes, and nothing else (everything not named here is vLLM's ``Worker``):

* ``init_device``: the local rank (data-parallel adjusted as vLLM's GPU worker does), the
  device ``npu:<visible index>``, the device set through the device module, HCCL process
  groups (``current_platform.dist_backend``), the memory snapshot the KV-cache budget is
  measured from (``torch.accelerator``, served by torch_npu's caching allocator), and the
  ``torch.cuda`` stream/event names routed to ``torch.npu`` before the runner is built,
  and ``torch.ops._C.weak_ref_tensor`` (graph capture) provided by torch_npu's where the
  device-less vLLM build has none (``worker/npu_device.py``).
* ``_make_model_runner``: always the plugin's V1 runner (``AscendNPUModelRunner``). vLLM
  picks Model Runner V2 whenever Triton is usable, and triton-ascend makes it usable on
  Atlas hosts; the plugin's metadata builders are written against V1. Logged once.
* ``compile_or_warm_up_model``: vLLM's warm-up sequence without its CUDA kernel tuning
  (``worker/npu_warmup.py``).
* ``sleep`` / ``wake_up``: refused with the reason (vLLM's sleep mode lives in CUDA's
  ``cumem`` allocator; the NPU platform reports sleep mode unavailable, so vLLM refuses
  ``--enable-sleep-mode`` before this point).
* ``profile``: refused for the CUDA-only profilers (``cuda``, ``proton``).

Nothing here runs on the development or CI machines; the classes are built and checked
against vLLM's and torch_npu's sources there (``tests/ut/worker/test_npu_worker*.py``).
"""

from __future__ import annotations

import contextlib
import gc
import types

import torch
from vllm.logger import init_logger
from vllm.model_executor.model_loader import get_model_loader
from vllm.platforms import current_platform
from vllm.utils.mem_utils import MemorySnapshot, format_gib
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.worker.gpu_worker import Worker, init_worker_distributed_environment
from vllm.v1.worker.utils import request_memory

from vllm_ascend_ext.errors import AscendExtError
from vllm_ascend_ext.platform.npu import AscendNPUPlatform
from vllm_ascend_ext.worker import npu_device
from vllm_ascend_ext.worker.orderly_stop import leave_ctrl_c_to_engine, log_final_summaries

logger = init_logger("vllm.ascend_ext")

CUDA_ONLY_PROFILERS = ("cuda", "proton")
# The NPU runtime's (and the stand-in's) visible devices, whichever platform runs the worker.
VISIBLE_ENV = AscendNPUPlatform.device_control_env_var


def dp_adjusted_local_rank(parallel_config, local_rank: int) -> int:
    """The device index a worker takes, as vLLM's GPU worker computes it: with several
    data-parallel replicas on one node (mp executor), replica ``r`` takes the devices
    after ``r * (TP * PCP * PP)``. Unless vLLM already gave the replica its own device
    shard (``assigned_physical_gpu_ids``: vLLM 0.32 does for every DP engine on a
    non-CUDA platform, and for Ray), where the local rank indexes that shard."""
    if getattr(parallel_config, "assigned_physical_gpu_ids", None) is not None:
        return local_rank
    if (parallel_config.distributed_executor_backend in ("ray", "external_launcher")
            or parallel_config.data_parallel_backend == "ray"
            or parallel_config.nnodes_within_dp != 1):
        return local_rank
    dp_local = parallel_config.data_parallel_rank_local
    if dp_local is None:
        dp_local = parallel_config.data_parallel_index
    replica = (parallel_config.pipeline_parallel_size
               * parallel_config.prefill_context_parallel_size
               * parallel_config.tensor_parallel_size)
    return local_rank + dp_local * replica


class AscendNPUWorker(Worker):
    """vLLM's GPU worker on an Ascend NPU (see module docstring)."""

    # The device module; ``npu_device.npu_module`` imports torch_npu (NPU hosts only).
    device_module_factory = staticmethod(npu_device.npu_module)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        leave_ctrl_c_to_engine(self.parallel_config)
        if self.use_v2_model_runner:
            logger.info_once("ascend_ext: NPU worker builds the V1 model runner "
                             "(vLLM chose Model Runner V2; the plugin's builders are V1)")
        self.use_v2_model_runner = False
        self.device_module: types.ModuleType | None = None

    def init_device(self) -> None:
        self.device_module = dev = self.device_module_factory()
        self.local_rank = dp_adjusted_local_rank(self.parallel_config, self.local_rank)
        assigned = getattr(self.parallel_config, "assigned_physical_gpu_ids", None)
        if assigned is not None:    # the replica's shard, for the logical -> visible mapping
            from vllm.platforms.interface import set_assigned_physical_gpu_ids

            set_assigned_physical_gpu_ids(assigned)
        count = dev.device_count()
        if self.local_rank >= count:
            raise AscendExtError(
                f"NPU worker rank {self.rank} needs device {self.local_rank}, but "
                f"{count} NPU(s) are visible ({VISIBLE_ENV}={_visible()!r}); "
                "lower the parallel sizes or make more devices visible")
        # the visible ordinal, kept: the stand-in's device is the CPU whatever the index
        self.device_index = index = current_platform.logical_device_id_to_visible_device_id(
            self.local_rank)
        self.device = self.device_for(index)
        dev.set_device(self.device)
        npu_device.route_cuda_streams(dev)
        npu_device.set_runtime(dev, self.runtime_kernels())
        self.provide_weak_ref_tensor()
        current_platform.check_if_supports_dtype(self.model_config.dtype)
        # Process groups first, so HCCL's buffers are in the snapshot the KV budget uses.
        init_worker_distributed_environment(self.vllm_config, self.rank,
                                            self.distributed_init_method, self.local_rank,
                                            current_platform.dist_backend)
        logger.info_once("ascend_ext: NPU worker on %s, V1 model runner "
                         "(vllm_ascend_ext.worker.npu_model_runner)", self.device)
        set_random_seed(self.model_config.seed)
        gc.collect()
        # The start-up runs about eight more full collections (the load's and the memory
        # profile's snapshots), each over the ~1M objects the imports left (0.4-0.5 s
        # each on a 2-core host): what survived the imports is frozen now, as vLLM
        # freezes the heap after start-up; its engine unfreezes it at shutdown.
        gc.freeze()
        dev.empty_cache()
        # Weights another process holds on this device (vLLM's external model loaders).
        external = get_model_loader(self.load_config).get_external_weight_memory(
            self.vllm_config)
        self.init_snapshot = MemorySnapshot(device=self.device)
        self.requested_memory = request_memory(self.init_snapshot, self.cache_config, external)
        logger.debug("NPU worker memory snapshot %r, requested %s GiB",
                     self.init_snapshot, format_gib(self.requested_memory))
        self._init_workspace_and_model_runner()

    def runtime_kernels(self) -> dict:
        """What the device runtime offers the layers by name (``npu_device``'s registry)."""
        return npu_device.torch_npu_kernels()

    def device_for(self, index: int) -> torch.device:
        """The torch device of visible device ``index``."""
        return torch.device(f"{current_platform.device_type}:{index}")

    def provide_weak_ref_tensor(self) -> None:
        # vLLM's graph capture needs torch.ops._C.weak_ref_tensor (npu_device.py).
        npu_device.provide_weak_ref_tensor(npu_device.npu_weak_ref())

    def _make_model_runner(self):
        from vllm_ascend_ext.worker.npu_model_runner import AscendNPUModelRunner

        return AscendNPUModelRunner(self.vllm_config, self.device)

    def determine_available_memory(self) -> int:
        # vLLM's profiling, then the decode graphs' share, which vLLM measures only on
        # CUDA/XPU (worker/npu_graph_memory.py).
        from vllm_ascend_ext.worker import npu_graph_memory

        return npu_graph_memory.budget(self, super().determine_available_memory())

    def compile_or_warm_up_model(self):
        # vLLM's sequence without its CUDA kernel warm-up (worker/npu_warmup.py).
        from vllm_ascend_ext.worker.npu_warmup import compile_or_warm_up

        return compile_or_warm_up(self)

    def _maybe_get_memory_pool_context(self, tag: str) -> contextlib.AbstractContextManager:
        # vLLM's GPU worker puts weights and KV cache in its sleep-mode allocator's pool
        # on every platform but CUDA (without cumem), XPU and the CPU, and raises for any
        # other: the NPU platform offers no sleep mode (vLLM refuses --enable-sleep-mode),
        # so both are allocated plainly.
        return contextlib.nullcontext()

    def sleep(self, level: int = 1) -> None:
        raise AscendExtError(
            "sleep mode is not available on the Ascend NPU platform (vLLM's sleep mode "
            "is built on CUDA's cumem allocator); serve without --enable-sleep-mode")

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.sleep()

    def profile(self, is_start: bool = True, *args, **kwargs):
        profiler = getattr(self.profiler_config, "profiler", None)
        if is_start and profiler in CUDA_ONLY_PROFILERS:
            raise AscendExtError(
                f"--profiler-config.profiler={profiler} profiles CUDA; on an NPU use "
                "profiler=torch (torch_npu's profiler records the NPU activity)")
        return super().profile(is_start, *args, **kwargs)

    def shutdown(self) -> None:
        log_final_summaries(getattr(self, "model_runner", None))
        super().shutdown()


def _visible() -> str | None:
    import os

    return os.environ.get(VISIBLE_ENV)
