"""The Ascend NPU platform (used when torch_npu reports an NPU).

Not validated here (no Ascend hardware on the development and CI machines): the
operator path it selects is the same one the emulated platform runs by
reference; the device runtime (worker, communicator, graph capture) awaits
Atlas 800 validation, as README states.
"""

from __future__ import annotations

import os

import torch
from vllm.logger import init_logger
from vllm.platforms.interface import Platform, PlatformEnum

from vllm_ascend_ext import envs
from vllm_ascend_ext.contract import mode as contract_mode
from vllm_ascend_ext.errors import AscendExtError
from vllm_ascend_ext.platform import npu_host, versions
from vllm_ascend_ext.platform import soc as soc_table
from vllm_ascend_ext.platform.config_hooks import (
    apply_quant_description,
    hybrid_prefix_caching_off,
    is_sparse_mla_model,
    refuse_data_parallel_moe,
    refuse_expert_parallel,
    sfa_block_size,
    validate_plugin_config,
)
from vllm_ascend_ext.platform.graph_mode import (
    apply_graph_mode,
    refuse_unsupported_parallelism,
    use_v1_runner,
)
from vllm_ascend_ext.platform.selection import preflight, select_attention_backend

logger = init_logger("vllm.ascend_ext")

PLATFORM_NAME = "ascend_ext-npu"
# The plugin's NPU worker (vLLM's GPU worker, device brought up through torch.npu) and
# the graph wrapper vLLM's runner captures with (torch.cuda's graph names are routed to
# torch.npu in the worker process: worker/npu_device.py).
WORKER_CLS = "vllm_ascend_ext.worker.npu_worker.AscendNPUWorker"
GRAPH_WRAPPER_CLS = "vllm_ascend_ext.worker.npu_graph.AscendNPUGraphWrapper"
SPAWN_ENV = "VLLM_WORKER_MULTIPROC_METHOD"


SPECULATION_SERVED = ("ngram",)


def refuse_speculation_without_substitutes(spec) -> None:
    """Speculative decoding on the NPU: ngram, whose proposer runs on the host and whose
    rejection sampler runs on the plugin's kernel substitutes
    (``worker/kernel_substitutes.py``). Drafter-based methods (EAGLE, MTP, DFlash, a draft
    model) launch vLLM's drafter Triton kernels, which have no NPU substitute yet: refused
    before the engine starts instead of failing on the first speculative step."""
    if spec is None:
        return
    method = getattr(spec, "method", None) or "speculative decoding"
    if method in SPECULATION_SERVED:
        return
    raise AscendExtError(
        f"--speculative-config (method {method!r}): on the Ascend NPU platform vLLM's "
        "drafter kernels for this method are Triton kernels with no NPU substitute yet; "
        f"serve with method {' or '.join(map(repr, SPECULATION_SERVED))} or without "
        "speculative decoding")


def exact_host_lists_with_speculation(vllm_config) -> None:
    """Under async scheduling with speculation vLLM's ``seq_lens_cpu_upper_bound`` is only
    a bound, and FIA's host lists must be exact: async scheduling goes off."""
    sched = vllm_config.scheduler_config
    if vllm_config.speculative_config is not None and sched.async_scheduling:
        sched.async_scheduling = False
        logger.info("ascend_ext: async scheduling off with speculative decoding (FIA takes "
                    "exact per-request lengths from the host)")


def use_spawn() -> None:
    """Workers start by spawn: this process imported torch_npu (the platform probe), and
    the NPU runtime does not survive a fork. vLLM forces spawn itself only for CUDA and
    XPU (``utils/system_utils.py``); an explicit ``fork`` is left as the user set it."""
    if os.environ.get(SPAWN_ENV) is None:
        os.environ[SPAWN_ENV] = "spawn"
        logger.info("ascend_ext: %s=spawn (NPU workers are spawned, never forked)", SPAWN_ENV)


class AscendNPUPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name: str = "npu"
    device_type: str = "npu"
    dispatch_key: str = "PrivateUse1"
    ray_device_key: str = "NPU"
    dist_backend: str = "hccl"
    device_control_env_var: str = "ASCEND_RT_VISIBLE_DEVICES"
    simple_compile_backend: str = "eager"

    @classmethod
    def soc(cls) -> soc_table.Soc:
        """The chip, without starting the NPU runtime (``platform/npu_host.py``):
        ``ASCEND_EXT_SOC`` if set, else what ``npu-smi`` reports."""
        name = envs.emulated_soc_name() or npu_host.query_soc_name()
        if name is None:
            raise AscendExtError(
                f"cannot tell this host's Ascend SoC: {npu_host.NPU_SMI} is missing or failed "
                f"(the plugin does not start the NPU runtime in the serving process to ask); "
                f"set {envs.SOC}=<chip>, e.g. ascend910b2, ascend910_9391, ascend950")
        try:
            return soc_table.from_name(name)
        except soc_table.UnknownSocError as exc:
            raise AscendExtError(f"SoC {name!r} (from {envs.SOC} or npu-smi): {exc}") from None

    @classmethod
    def check_stack(cls) -> None:
        """torch / torch_npu / CANN versions, read without importing torch_npu."""
        versions.check_npu_stack(torch.__version__,
                                 npu_host.distribution_version("torch-npu"),
                                 npu_host.cann_version())

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return torch.npu.get_device_name(device_id)

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return torch.npu.get_device_properties(device_id).total_memory

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        torch.npu.set_device(device)

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        torch.npu.manual_seed_all(seed)

    @classmethod
    def inference_mode(cls):
        return torch.inference_mode()

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return True

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16]

    def is_sleep_mode_available(self) -> bool:
        # vLLM's sleep mode is CUDA's cumem allocator; vLLM refuses --enable-sleep-mode.
        return False

    @classmethod
    def get_current_memory_usage(cls, device=None) -> float:
        torch.npu.empty_cache()
        torch.npu.reset_peak_memory_stats(device)
        return torch.npu.max_memory_allocated(device)

    @classmethod
    def check_if_supports_dtype(cls, dtype: torch.dtype) -> None:
        if dtype not in (torch.bfloat16, torch.float16):
            raise AscendExtError(
                f"--dtype {str(dtype).removeprefix('torch.')}: the Ascend kernels the plugin "
                "calls take bfloat16 or float16; serve with --dtype bfloat16")

    @classmethod
    def current_stream(cls):
        # vLLM's current_stream() asks an OOT platform for its first stream.
        return torch.npu.current_stream()

    @classmethod
    def support_static_graph_mode(cls) -> bool:
        # Decode graphs: FIA's host lists are updated on every replay
        # (attention/fia/graph_tasks.py); see graph_mode().
        return True

    @classmethod
    def get_static_graph_wrapper_cls(cls) -> str:
        return GRAPH_WRAPPER_CLS

    @classmethod
    def graph_pool_handle(cls):
        return torch.npu.graph_pool_handle()

    @classmethod
    def support_hybrid_kv_cache(cls) -> bool:
        # Hybrid models (linear attention beside full attention) await the plugin's
        # Gated-DeltaNet layers: one KV-cache group kind at a time.
        return False

    @classmethod
    def check_runner_kv_caches_multi_layer(cls) -> None:
        # An SFA layer declares three cache layers under one layer index (latent, rope
        # key, indexer key); vLLM's GPU runner, which the NPU runner builds on, handles
        # several caches per index (CUDA and the CPU platform declare the same).
        return None

    @classmethod
    def worker_cls_path(cls) -> str:
        return WORKER_CLS

    @classmethod
    def opaque_attention_op(cls) -> bool:
        # Attention is one opaque custom op (as on the emulated platform, which inherits
        # it from vLLM's CPU platform): a compiled graph never traces FIA's per-step host
        # lists.
        return True

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None) -> str:
        return select_attention_backend(PLATFORM_NAME, cls.soc(), attn_selector_config)

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        validate_plugin_config(vllm_config)
        if contract_mode.enabled():
            raise AscendExtError(
                f"{contract_mode.ENV}=1 is for the emulated platform (ASCEND_EXT_EMULATE=1): "
                "on an NPU the operators themselves are the contract")
        cls.check_stack()
        soc = soc_table.require_supported(cls.soc())
        use_spawn()
        parallel = vllm_config.parallel_config
        if parallel.worker_cls == "auto":
            parallel.worker_cls = WORKER_CLS
        apply_quant_description(vllm_config)
        refuse_expert_parallel(vllm_config)
        refuse_data_parallel_moe(vllm_config)
        why = hybrid_prefix_caching_off(vllm_config)
        if why:
            logger.warning("ascend_ext: %s", why)
        apply_graph_mode(vllm_config, sparse=is_sparse_mla_model(vllm_config.model_config))
        refuse_unsupported_parallelism(vllm_config)
        use_v1_runner(vllm_config)
        cache = vllm_config.cache_config
        if is_sparse_mla_model(vllm_config.model_config):
            sfa_block_size(cache)
        elif not cache.user_specified_block_size:
            cache.block_size = 128
        refuse_speculation_without_substitutes(vllm_config.speculative_config)
        exact_host_lists_with_speculation(vllm_config)
        preflight(PLATFORM_NAME, soc, vllm_config)

    @classmethod
    def register_triton_kernel_overrides(cls) -> None:
        # vLLM calls this in every worker: its core Triton kernels, as torch on the NPU.
        from vllm_ascend_ext.worker import kernel_substitutes

        kernel_substitutes.register()

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return "vllm.distributed.device_communicators.base_device_communicator.DeviceCommunicatorBase"
