"""The emulated Ascend platform: the NPU platform on a CPU stand-in device.

``EmulatedAscendPlatform`` *is* the platform an Atlas host runs (``AscendNPUPlatform``, a
vLLM ``Platform`` of kind ``OOT``), so every vLLM branch that asks the platform
(``is_cpu()``, ``is_out_of_tree()``, the block-size step, async scheduling, the sampler,
custom-op dispatch, the MoE op, graph-memory profiling) takes the NPU's side. It overrides
only what the device itself requires, each a named exception in ``docs/engine-path.md``:

* the torch device is ``cpu`` (``device_type``, ``dispatch_key``; gloo for collectives);
  the device runtime is the CPU stand-in of ``torch.npu`` (``emulation/cpu_npu.py``),
  brought up by the emulated NPU worker (``emulation/npu_worker.py``);
* the chip is ``ASCEND_EXT_SOC`` (no ``npu-smi``), and no NPU stack is checked;
* float32 is served besides bfloat16 / float16 (the references compute it: exact
  comparisons), and there is no pinned memory on a CPU build;
* the KV-cache size is chosen for a shared host when none is given
  (``emulation/kv_budget.py``), and contract mode may check every torch_npu call.

vLLM's CPU worker, kept for comparison only (``ASCEND_EXT_EMULATED_WORKER=cpu``), runs on
vLLM's CPU platform instead (``emulation/cpu_platform.py``).
"""

from __future__ import annotations

import os

import psutil
import torch
from vllm.logger import init_logger

from vllm_ascend_ext import envs
from vllm_ascend_ext.contract import mode as contract_mode
from vllm_ascend_ext.contract.oracle import VERSION as ORACLE_VERSION
from vllm_ascend_ext.emulation import kv_budget
from vllm_ascend_ext.emulation.allocator import keep_large_blocks_in_heap
from vllm_ascend_ext.platform import ray_env, startup
from vllm_ascend_ext.platform import soc as soc_table
from vllm_ascend_ext.platform.config_hooks import compile_cache_that_loads
from vllm_ascend_ext.platform.npu import AscendNPUPlatform

logger = init_logger("vllm.ascend_ext")

PLATFORM_NAME = "ascend_ext-emulated"
WORKER_CLS = "vllm_ascend_ext.emulation.npu_worker.EmulatedNPUWorker"
STAND_IN_DEVICE = "Ascend stand-in (CPU)"

# Every member the emulated platform answers differently from the NPU platform, and why:
# the named exceptions (tests/ut/platform/test_platform_conformance.py holds the class to this
# table; ``doctor`` prints it under emulation). Everything else is the NPU platform's.
EXCEPTIONS = {
    "device_name": "the torch device is the CPU",
    "device_type": "the torch device is the CPU",
    "dispatch_key": "the torch device is the CPU",
    "dist_backend": "gloo: the ranks' collectives run between CPU processes (HCCL on an NPU)",
    "soc": "the chip is ASCEND_EXT_SOC (no npu-smi)",
    "check_stack": "no torch_npu or CANN to check: the references stand in for both",
    "get_device_name": "the stand-in's name",
    "get_device_total_memory": "the host's memory",
    "num_compute_units": "the host's cores (an NPU: its vector cores)",
    "set_device": "one CPU device",
    "manual_seed_all": "torch.manual_seed seeds the CPU generator",
    "is_pin_memory_available": "a CPU build of torch has no pinned memory",
    "supported_dtypes": "float32 besides bfloat16 / float16: the references compute it "
                        "(exact comparisons)",
    "check_if_supports_dtype": "float32 accepted (contract mode requires an NPU dtype)",
    "get_current_memory_usage": "the stand-in runtime's memory model",
    "current_stream": "the stand-in runtime's stream",
    "graph_pool_handle": "the stand-in runtime's graph pool",
    "import_kernels": "plus the host allocator tuning for the references' temporaries, and "
                      "torch.accelerator's cache calls as no-ops in a process without the "
                      "stand-in (a CPU build raises there)",
    "label": "the platform's name in start-up messages (ascend_ext-emulated)",
    "_check": "the emulated chip and contract mode instead of the NPU stack",
    "_setup": "the emulated NPU worker, the KV-cache size for a shared host, Ray's "
              "environment for the plugin",
    "_finish": "vLLM's compile cache that loads on the CPU",
}


def check_emulation(vllm_config) -> soc_table.Soc:
    """The chip to emulate and contract mode, each from the environment: a bad value
    fails here, before the engine starts."""
    soc = envs.emulated_soc()
    if contract_mode.enabled():
        if vllm_config.model_config is not None:
            contract_mode.require_npu_dtype(vllm_config.model_config.dtype)
        logger.info_once("ascend_ext: NPU contract mode: every torch_npu call is checked "
                         "against torch-npu %s (pretending %s)", ORACLE_VERSION, soc.name)
    return soc


def choose_kv_budget(vllm_config) -> None:
    """The KV-cache size for the stand-in's memory (the host's): vLLM's CPU variable
    (``VLLM_CPU_KVCACHE_SPACE``, GiB), else the emulated platform's choice."""
    if kv_budget.from_env(vllm_config.cache_config):
        return
    budget = kv_budget.apply(vllm_config, psutil.virtual_memory().available)
    if budget is not None:
        logger.info(
            "ascend_ext: emulated KV cache %.2f GiB (%s); vLLM's default would reserve "
            "%.0f%% of the device. Choose with %s=<GiB> or --kv-cache-memory-bytes.",
            budget.nbytes / kv_budget.GiB, budget.reason,
            vllm_config.cache_config.gpu_memory_utilization * 100, kv_budget.ENV_VAR)


def carry_plugin_env_to_ray(vllm_config) -> None:
    """On vLLM's Ray executor the actors pick this platform only if they see the driver's
    ``ASCEND_EXT_*`` at import: into their runtime environment with them
    (``platform/ray_env.py``)."""
    parallel = vllm_config.parallel_config
    if parallel.distributed_executor_backend != "ray":
        return
    from ray.runtime_env import RuntimeEnv

    parallel.ray_runtime_env = RuntimeEnv(**ray_env.with_plugin_env(
        parallel.ray_runtime_env, os.environ))


def _runtime():
    from vllm_ascend_ext.worker import npu_device

    return npu_device.current_runtime()


class EmulatedAscendPlatform(AscendNPUPlatform):
    """The NPU platform on the CPU stand-in device (see module docstring)."""

    device_name: str = "cpu"
    device_type: str = "cpu"
    dispatch_key: str = "CPU"
    dist_backend: str = "gloo"
    label: str = PLATFORM_NAME

    @classmethod
    def soc(cls) -> soc_table.Soc:
        return envs.emulated_soc()

    @classmethod
    def check_stack(cls) -> None:
        return None  # no torch_npu or CANN: the references stand in for both

    # -- the device: the CPU stand-in -------------------------------------------------
    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return STAND_IN_DEVICE

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return psutil.virtual_memory().total

    @classmethod
    def num_compute_units(cls, device_id: int = 0) -> int:
        return os.cpu_count() or 1

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        return None

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        return None  # torch.manual_seed (vLLM's seed_everything) seeds the CPU

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False  # a CPU build of torch has no pinned memory

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def check_if_supports_dtype(cls, dtype) -> None:
        # the references compute float32 too (exact comparisons); contract mode requires
        # an NPU dtype itself (check_emulation)
        return None

    @classmethod
    def get_current_memory_usage(cls, device=None) -> float:
        runtime = _runtime()
        return 0.0 if runtime is None else float(runtime.max_memory_allocated())

    @classmethod
    def current_stream(cls):
        runtime = _runtime()
        return None if runtime is None else runtime.current_stream()

    @classmethod
    def graph_pool_handle(cls):
        return _runtime().graph_pool_handle()

    @classmethod
    def import_kernels(cls) -> None:
        # Called by vLLM in every process that runs kernels (engine core, workers).
        super().import_kernels()
        keep_large_blocks_in_heap()
        from vllm_ascend_ext.emulation import cpu_npu

        cpu_npu.quiet_host_accelerator()

    # -- start-up: the NPU platform's policy, with emulation's own steps ---------------
    @classmethod
    def _check(cls, vllm_config) -> tuple[soc_table.Soc, bool]:
        return check_emulation(vllm_config), True

    @classmethod
    def _setup(cls, start: startup.Start) -> None:
        """The NPU platform's set-up with the emulated worker, then the KV-cache size."""
        parallel = start.vllm_config.parallel_config
        if parallel.worker_cls == "auto":
            parallel.worker_cls = WORKER_CLS
        super()._setup(start)
        choose_kv_budget(start.vllm_config)
        carry_plugin_env_to_ray(start.vllm_config)

    @classmethod
    def _finish(cls, start: startup.Start) -> None:
        why = compile_cache_that_loads()
        if why:
            logger.info_once("ascend_ext: %s", why)
