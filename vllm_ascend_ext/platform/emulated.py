"""The emulated Ascend platform: real vLLM on the CPU, NPU operators by reference.

A true vLLM platform (a ``CpuPlatform`` subclass keeping ``PlatformEnum.CPU``, so vLLM's
scheduler, KV-cache manager and sampler run unchanged). Its engine runs the Atlas path: the
plugin's NPU worker and NPU model runner on a CPU stand-in of the NPU device runtime
(``worker/emulated_npu.py``, ``worker/cpu_npu.py``), with decode graphs where the NPU
platform captures them (``platform/graph_mode.py``); ``ASCEND_EXT_EMULATED_WORKER=cpu``
takes vLLM's CPU worker instead (``worker/emulated.py``). The attention backends are the
plugin's, calling the reference operators. With no KV-cache size given it picks one that
fits (``platform/kv_budget.py``) instead of vLLM's CPU default of 92% of RAM. Its start-up
is the NPU platform's policy (``platform/startup.py``), vLLM's CPU platform running as
emulation's own set-up.
"""

from __future__ import annotations

import os

import psutil
from vllm.logger import init_logger
from vllm.platforms.cpu import CpuPlatform

from vllm_ascend_ext import envs
from vllm_ascend_ext.contract import mode as contract_mode
from vllm_ascend_ext.contract.oracle import VERSION as ORACLE_VERSION
from vllm_ascend_ext.platform import kv_budget, ray_env, startup
from vllm_ascend_ext.platform import soc as soc_table
from vllm_ascend_ext.platform.allocator import keep_large_blocks_in_heap
from vllm_ascend_ext.platform.config_hooks import compile_cache_that_loads
from vllm_ascend_ext.platform.npu import RAY_NOSET_VISIBLE
from vllm_ascend_ext.platform.selection import select_attention_backend

logger = init_logger("vllm.ascend_ext")

PLATFORM_NAME = "ascend_ext-emulated"
WORKER_CLS = "vllm_ascend_ext.worker.emulated_npu.EmulatedNPUWorker"
NPU_GRAPH_WRAPPER_CLS = "vllm_ascend_ext.worker.npu_graph.AscendNPUGraphWrapper"
CPU_WORKER_CLS = "vllm_ascend_ext.worker.emulated.EmulatedAscendWorker"


OMP_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def leave_worker_threads_unbound(environ=os.environ) -> bool:
    """The NPU engine's workers are not vLLM's CPU workers: vLLM's executor binds a CPU
    platform's workers to one NUMA node each ("auto"), which asserts on a machine with
    fewer nodes than ranks; an NPU platform binds none. ``nobind`` unless the user chose
    (True when set here)."""
    if OMP_BIND_ENV in environ:
        return False
    environ[OMP_BIND_ENV] = "nobind"
    logger.info_once("ascend_ext: %s=nobind: the emulated NPU workers' threads are not "
                     "bound per NUMA node (vLLM binds only its CPU workers'); set it to "
                     "choose", OMP_BIND_ENV)
    return True


class EmulatedAscendPlatform(CpuPlatform):
    # Ray places workers on "NPU" resources, as on an Atlas node: a local cluster declares
    # them (``ray start --head --resources '{"NPU": N}'``), each one the CPU stand-in.
    ray_device_key: str = "NPU"
    ray_noset_device_env_vars: list[str] = [RAY_NOSET_VISIBLE]

    @classmethod
    def soc(cls) -> soc_table.Soc:
        return envs.emulated_soc()

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None) -> str:
        if selected_backend is not None and selected_backend.name != "ASCEND_EXT_FIA":
            logger.info_once(
                "ascend_ext: attention backend %s was requested; the emulated Ascend "
                "platform serves its own backend instead", selected_backend.name,
            )
        return select_attention_backend(PLATFORM_NAME, cls.soc(), attn_selector_config)

    @classmethod
    def support_static_graph_mode(cls) -> bool:
        # Decode graphs on the CPU stand-in device, as on an NPU (NPU worker only).
        return envs.emulated_worker() == "npu"

    @classmethod
    def get_static_graph_wrapper_cls(cls) -> str:
        return NPU_GRAPH_WRAPPER_CLS

    @classmethod
    def graph_pool_handle(cls):
        from vllm_ascend_ext.worker import npu_device

        return npu_device.current_runtime().graph_pool_handle()

    @classmethod
    def check_if_supports_dtype(cls, dtype) -> None:
        # The NPU worker asks; the references compute every dtype vLLM's CPU path takes
        # (float32 for exact comparisons; contract mode requires an NPU dtype itself).
        return None

    @classmethod
    def import_kernels(cls) -> None:
        # Called by vLLM in every process that runs kernels (engine core, workers).
        super().import_kernels()
        keep_large_blocks_in_heap()

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        # the NPU platform's communicator, on the CPU group's gloo backend
        from vllm_ascend_ext.distributed.communicator import NAME

        return NAME

    @classmethod
    def register_triton_kernel_overrides(cls) -> None:
        # vLLM's CPU substitutes, then the NPU platform's over them where it has its own:
        # emulation runs the kernels an Atlas host runs (worker/kernel_substitutes.py).
        super().register_triton_kernel_overrides()
        from vllm_ascend_ext.worker import kernel_substitutes

        kernel_substitutes.register()

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        # The NPU platform's policy (platform/startup.py) with emulation's own steps beside it.
        startup.run(vllm_config, startup.Side(PLATFORM_NAME, check=cls._check,
                                              setup=cls._setup, finish=cls._finish))

    @classmethod
    def _check(cls, vllm_config) -> tuple[soc_table.Soc, bool]:
        """The chip to emulate, contract mode and the worker, each from the environment: a
        bad value fails here, before the engine starts. The NPU engine unless
        ``ASCEND_EXT_EMULATED_WORKER=cpu``."""
        soc = cls.soc()
        if contract_mode.enabled():
            if vllm_config.model_config is not None:
                contract_mode.require_npu_dtype(vllm_config.model_config.dtype)
            logger.info_once("ascend_ext: NPU contract mode: every torch_npu call is checked "
                             "against torch-npu %s (pretending %s)", ORACLE_VERSION, soc.name)
        return soc, envs.emulated_worker() == "npu"

    @classmethod
    def _setup(cls, start: startup.Start) -> None:
        """The worker, the KV-cache size, then vLLM's CPU platform; what it changes for its
        own kernels that the plugin's replace is put back."""
        vllm_config = start.vllm_config
        sched, cache = vllm_config.scheduler_config, vllm_config.cache_config
        parallel = vllm_config.parallel_config
        if parallel.worker_cls == "auto":
            parallel.worker_cls = WORKER_CLS if start.npu_engine else CPU_WORKER_CLS
        if start.npu_engine:
            leave_worker_threads_unbound()
        budget = kv_budget.apply(vllm_config, psutil.virtual_memory().available)
        if budget is not None:
            logger.info(
                "ascend_ext: emulated KV cache %.2f GiB (%s); vLLM's CPU default would "
                "reserve %.0f%% of RAM. Choose with %s=<GiB> or --kv-cache-memory-bytes.",
                budget.nbytes / kv_budget.GiB, budget.reason,
                cache.gpu_memory_utilization * 100, kv_budget.ENV_VAR,
            )
        kept = (sched.enable_chunked_prefill, cache.enable_prefix_caching,
                sched.max_num_batched_tokens)
        capture_sizes = list(vllm_config.compilation_config.cudagraph_capture_sizes or [])
        executor = parallel.distributed_executor_backend
        async_scheduling = sched.async_scheduling
        super().check_and_update_config(vllm_config)
        if start.npu_engine:
            # vLLM's CPU platform turns async scheduling off; vLLM resolved it before the
            # platform hook as it does for the NPU platform (on unless an option rules it
            # out): the NPU engine keeps that choice (speculation turns it off later,
            # config_hooks.exact_host_lists_with_speculation).
            sched.async_scheduling = async_scheduling
            # vLLM's CPU platform clears the capture sizes vLLM chose; the graph-mode
            # default (platform/graph_mode.py) keeps them or clears them itself.
            vllm_config.compilation_config.cudagraph_capture_sizes = capture_sizes
            # It also moves a one-rank engine's worker into a process of its own, for its
            # CPU worker's OpenMP binding; the NPU worker runs in the engine core, as on an
            # NPU (vLLM's one-rank executor), which spares a process start (~10 s).
            parallel.distributed_executor_backend = executor
        cls._carry_plugin_env_to_ray(vllm_config)
        if start.facts.sparse_mla:
            # vLLM's CPU platform turns chunked prefill and prefix caching off for MLA
            # (its CPU MLA kernel); the SFA backend serves both, on its own block size.
            if kept != (sched.enable_chunked_prefill, cache.enable_prefix_caching,
                        sched.max_num_batched_tokens):
                logger.info_once(
                    "ascend_ext: chunked prefill %s, prefix caching %s as configured: vLLM's "
                    "CPU-platform line 'MLA is enabled on a non-GPU platform; forcing chunked "
                    "prefill and prefix caching to be disabled' is about its own CPU MLA "
                    "kernel, which the plugin's SFA backend replaces",
                    "on" if kept[0] else "off", "on" if kept[1] else "off")
            (sched.enable_chunked_prefill, cache.enable_prefix_caching,
             sched.max_num_batched_tokens) = kept

    @staticmethod
    def _carry_plugin_env_to_ray(vllm_config) -> None:
        """On vLLM's Ray executor the actors pick this platform only if they see the
        driver's ``ASCEND_EXT_*`` at import: into their runtime environment with them
        (``platform/ray_env.py``)."""
        parallel = vllm_config.parallel_config
        if parallel.distributed_executor_backend != "ray":
            return
        from ray.runtime_env import RuntimeEnv

        parallel.ray_runtime_env = RuntimeEnv(**ray_env.with_plugin_env(
            parallel.ray_runtime_env, os.environ))

    @classmethod
    def _finish(cls, start: startup.Start) -> None:
        """Under decode graphs the model compiles with Dynamo's eager backend: the stand-in
        records graphs at the dispatcher, where inductor's CPU kernels would not be seen.
        Then the compile cache that loads."""
        from vllm.config import CompilationMode, CUDAGraphMode

        comp = start.vllm_config.compilation_config
        parallel = start.vllm_config.parallel_config
        exchange = (parallel.data_parallel_size > 1
                    or (parallel.enable_expert_parallel and parallel.tensor_parallel_size > 1))
        if exchange and comp.mode != CompilationMode.NONE:
            # vLLM calls a CPU platform's MoE layers inside the compiled model, so their DP
            # token exchange (sizes read from the forward context each step) would be
            # traced; on an NPU it runs inside vLLM's opaque moe_forward op.
            logger.info_once("ascend_ext: data/expert-parallel token exchanges on the "
                             "emulated platform run uncompiled (vLLM traces a CPU platform's "
                             "MoE layers; on an NPU they run inside its moe_forward op)")
            comp.mode = CompilationMode.NONE
        if (start.npu_engine and comp.cudagraph_mode != CUDAGraphMode.NONE
                and comp.mode != CompilationMode.NONE and comp.backend != "eager"):
            logger.info_once("ascend_ext: decode graphs on the CPU stand-in are recorded at the "
                             "dispatcher: the model compiles with Dynamo's eager backend")
            comp.backend = "eager"
        why = compile_cache_that_loads()
        if why:
            logger.info_once("ascend_ext: %s", why)
