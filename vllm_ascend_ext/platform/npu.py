"""The Ascend NPU platform (used when torch_npu reports an NPU).

Not validated here (no Ascend hardware on the development and CI machines): the
operator path it selects is the same one the emulated platform runs by
reference; the device runtime (worker, communicator, graph capture) awaits
Atlas 800 validation, as docs/atlas.md states.
"""

from __future__ import annotations

import os

import torch
from vllm.logger import init_logger
from vllm.platforms.interface import Platform, PlatformEnum

from vllm_ascend_ext import envs
from vllm_ascend_ext.contract import mode as contract_mode
from vllm_ascend_ext.errors import AscendExtError
from vllm_ascend_ext.platform import npu_host, startup, versions
from vllm_ascend_ext.platform import soc as soc_table
from vllm_ascend_ext.platform.selection import select_attention_backend

logger = init_logger("vllm.ascend_ext")

PLATFORM_NAME = "ascend_ext-npu"
# The plugin's NPU worker (vLLM's GPU worker, device brought up through torch.npu) and
# the graph wrapper vLLM's runner captures with (torch.cuda's graph names are routed to
# torch.npu in the worker process: worker/npu_device.py).
WORKER_CLS = "vllm_ascend_ext.worker.npu_worker.AscendNPUWorker"
RAY_NOSET_VISIBLE = "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"
GRAPH_WRAPPER_CLS = "vllm_ascend_ext.worker.npu_graph.AscendNPUGraphWrapper"
SPAWN_ENV = "VLLM_WORKER_MULTIPROC_METHOD"


def use_spawn() -> None:
    """Workers start by spawn: this process imported torch_npu (the platform probe), and
    the NPU runtime does not survive a fork. vLLM forces spawn itself only for CUDA and
    XPU (``utils/system_utils.py``); an explicit ``fork`` is left as the user set it."""
    if os.environ.get(SPAWN_ENV) is None:
        os.environ[SPAWN_ENV] = "spawn"
        logger.info("ascend_ext: %s=spawn (NPU workers are spawned, never forked)", SPAWN_ENV)


def refuse_unsupported_parallelism(vllm_config) -> None:
    """Options whose vLLM implementation is CUDA-only, refused before serving starts (the
    emulated platform leaves them to vLLM's CPU platform, which turns them off)."""
    parallel = vllm_config.parallel_config
    if getattr(parallel, "enable_dbo", False):
        raise AscendExtError(
            "--enable-dbo (dual-batch overlap) drives CUDA streams and cuBLAS handles "
            "directly; it is not available on the Ascend NPU platform")


V2_ENV = "VLLM_USE_V2_MODEL_RUNNER"


def use_v1_runner(vllm_config) -> None:
    """The whole engine (scheduler and workers) on vLLM's V1 model runner, which the NPU
    worker builds: vLLM picks V2 wherever Triton is usable (triton-ascend included) and
    its scheduler formats its output for the runner it picked. Set before the engine
    starts (the engine core and workers inherit it); refused where V2 is required."""
    if os.environ.get(V2_ENV, "").strip().lower() in ("1", "true"):
        raise AscendExtError(
            f"{V2_ENV}=1: the NPU worker runs vLLM's V1 model runner (the plugin's metadata "
            f"builders are V1); unset {V2_ENV}")
    os.environ[V2_ENV] = "0"
    if vllm_config.use_v2_model_runner:
        raise AscendExtError(
            "this configuration needs vLLM's Model Runner V2 (HiSparse attention or "
            "watermarking), which the NPU platform does not run")


class AscendNPUPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name: str = "npu"
    device_type: str = "npu"
    dispatch_key: str = "PrivateUse1"
    ray_device_key: str = "NPU"
    # Ray's NPU accelerator would narrow each actor to its own device in
    # ASCEND_RT_VISIBLE_DEVICES; vLLM's Ray executor maps ranks to physical ids itself
    # (``assigned_physical_gpu_ids``) and needs every device of the node visible.
    ray_noset_device_env_vars: list[str] = [RAY_NOSET_VISIBLE]
    dist_backend: str = "hccl"
    device_control_env_var: str = "ASCEND_RT_VISIBLE_DEVICES"
    simple_compile_backend: str = "eager"
    label: str = PLATFORM_NAME   # the platform as start-up messages name it

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
    def num_compute_units(cls, device_id: int = 0) -> int:
        # vLLM sizes its Triton launches by it (one program per unit; triton-ascend runs
        # them on the vector cores); torch_npu reports the device's vector-core count.
        return int(torch.npu.get_device_limit(device_id)["vector_core_num"])

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
        # vLLM's hybrid KV-cache manager: the Gated-DeltaNet models (Qwen3-Next, Qwen3.5)
        # keep their recurrent state beside the attention layers' paged cache; without it
        # vLLM cannot unify their cache specs and refuses them.
        return True

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
        # Attention is one opaque custom op: a compiled graph never traces FIA's per-step
        # host lists.
        return True

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None) -> str:
        return select_attention_backend(cls.label, cls.soc(), attn_selector_config)

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        # The shared policy (platform/startup.py) with the platform's own steps beside it.
        startup.run(vllm_config, startup.Side(cls.label, check=cls._check,
                                              refuse=cls._refuse, setup=cls._setup,
                                              finish=cls._finish))

    @classmethod
    def _finish(cls, start: startup.Start) -> None:
        return None

    @classmethod
    def _check(cls, vllm_config) -> tuple[soc_table.Soc, bool]:
        """Can the NPU platform start here: the chip it serves, on the NPU engine."""
        if contract_mode.enabled():
            raise AscendExtError(
                f"{contract_mode.ENV}=1 is for the emulated platform (ASCEND_EXT_EMULATE=1): "
                "on an NPU the operators themselves are the contract")
        cls.check_stack()
        return soc_table.require_supported(cls.soc()), True

    @classmethod
    def _refuse(cls, start: startup.Start) -> None:
        refuse_unsupported_parallelism(start.vllm_config)
        use_v1_runner(start.vllm_config)  # its switch is an env var only the engine reads

    @classmethod
    def _setup(cls, start: startup.Start) -> None:
        """What vLLM's own platforms set for themselves: spawned workers, the worker class,
        a block size (the SFA default replaces it for an SFA model)."""
        use_spawn()
        parallel, cache = start.vllm_config.parallel_config, start.vllm_config.cache_config
        if parallel.worker_cls == "auto":
            parallel.worker_cls = WORKER_CLS
        if not cache.user_specified_block_size:
            cache.block_size = 128

    @classmethod
    def _preferred_block_size_for_backends(cls, backend_classes, default_block_size: int,
                                           vllm_config) -> int:
        """vLLM's block-size step takes one backend's preference, but for several it takes
        the smallest size all accept (16 for an SFA model: its companion cache layers'
        backend accepts every multiple of 16): the largest preference every backend
        accepts instead (SFA's 128), else vLLM's rule."""
        from vllm.config.vllm import set_current_vllm_config

        with set_current_vllm_config(vllm_config):
            preferred = sorted({b.get_preferred_block_size(default_block_size)
                                for b in backend_classes}, reverse=True)
            for size in preferred:
                if all(b.supports_block_size(size) for b in backend_classes):
                    return size
        return super()._preferred_block_size_for_backends(backend_classes, default_block_size,
                                                          vllm_config)

    @classmethod
    def register_triton_kernel_overrides(cls) -> None:
        # vLLM calls this in every worker: its core Triton kernels, as torch on the NPU.
        from vllm_ascend_ext.worker import kernel_substitutes

        kernel_substitutes.register()

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        # the plugin's: variable-size collectives and the MoE token exchange on HCCL
        from vllm_ascend_ext.distributed.communicator import NAME

        return NAME
