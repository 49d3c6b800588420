"""vLLM's CPU platform with the plugin's backends: the comparison engine of emulation.

``ASCEND_EXT_EMULATE=1 ASCEND_EXT_EMULATED_WORKER=cpu`` selects it instead of the emulated
NPU platform (``emulation/platform.py``): vLLM's CPU worker and runner (plus the plugin's
orderly stop and block zeroing, ``emulation/cpu_worker.py``), vLLM's CPU platform's
choices, the plugin's attention backends, MoE methods and operators by reference. It
exists so that tests can hold the NPU engine path to what vLLM's own CPU engine computes
with the same operators (``tests/e2e/test_engine_path.py``); nothing an Atlas runs is
decided here.
"""

from __future__ import annotations

from vllm.logger import init_logger
from vllm.platforms.cpu import CpuPlatform

from vllm_ascend_ext.emulation.allocator import keep_large_blocks_in_heap
from vllm_ascend_ext.emulation.platform import (
    PLATFORM_NAME,
    carry_plugin_env_to_ray,
    check_emulation,
    choose_kv_budget,
)
from vllm_ascend_ext.platform import soc as soc_table
from vllm_ascend_ext.platform import startup
from vllm_ascend_ext.platform.npu import RAY_NOSET_VISIBLE
from vllm_ascend_ext.platform.selection import select_attention_backend

logger = init_logger("vllm.ascend_ext")

WORKER_CLS = "vllm_ascend_ext.emulation.cpu_worker.EmulatedAscendWorker"


class EmulatedCpuWorkerPlatform(CpuPlatform):
    ray_device_key: str = "NPU"
    ray_noset_device_env_vars: list[str] = [RAY_NOSET_VISIBLE]

    @classmethod
    def soc(cls) -> soc_table.Soc:
        from vllm_ascend_ext import envs

        return envs.emulated_soc()

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None) -> str:
        return select_attention_backend(PLATFORM_NAME, cls.soc(), attn_selector_config)

    @classmethod
    def check_if_supports_dtype(cls, dtype) -> None:
        return None

    @classmethod
    def import_kernels(cls) -> None:
        super().import_kernels()
        keep_large_blocks_in_heap()

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        from vllm_ascend_ext.distributed.communicator import NAME

        return NAME

    @classmethod
    def register_triton_kernel_overrides(cls) -> None:
        super().register_triton_kernel_overrides()
        from vllm_ascend_ext.worker import kernel_substitutes

        kernel_substitutes.register()

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        startup.run(vllm_config, startup.Side(PLATFORM_NAME, check=cls._check,
                                              setup=cls._setup))

    @classmethod
    def _check(cls, vllm_config) -> tuple[soc_table.Soc, bool]:
        return check_emulation(vllm_config), False

    @classmethod
    def _setup(cls, start: startup.Start) -> None:
        """The worker and the KV-cache size, then vLLM's CPU platform; an SFA model keeps
        chunked prefill and prefix caching (vLLM's CPU platform turns them off for its own
        MLA kernel, which the plugin's SFA backend replaces)."""
        vllm_config = start.vllm_config
        sched, cache = vllm_config.scheduler_config, vllm_config.cache_config
        if vllm_config.parallel_config.worker_cls == "auto":
            vllm_config.parallel_config.worker_cls = WORKER_CLS
        choose_kv_budget(vllm_config)
        kept = (sched.enable_chunked_prefill, cache.enable_prefix_caching,
                sched.max_num_batched_tokens)
        super().check_and_update_config(vllm_config)
        carry_plugin_env_to_ray(vllm_config)
        if start.facts.sparse_mla:
            (sched.enable_chunked_prefill, cache.enable_prefix_caching,
             sched.max_num_batched_tokens) = kept
