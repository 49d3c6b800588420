"""Platform conformance: every ``Platform`` member vLLM 0.32 calls (``current_platform.<name>``
anywhere in vLLM outside ``vllm/platforms``), and ``AscendNPUPlatform``'s answer to each:
its own definition, vLLM's base default (named, with why it is the NPU's answer), or a
refusal at start-up of the option that reaches it. A name vLLM starts calling that is not
classified here fails, and so does a base hook that raises ``NotImplementedError`` with no
refusal in front of it. Beside it, what vllm-ascend's ``NPUPlatform`` overrides."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import vllm
from vllm.platforms.interface import Platform

from vllm_ascend_ext.errors import AscendExtError
from vllm_ascend_ext.platform import unanswered
from vllm_ascend_ext.platform.npu import AscendNPUPlatform

# The plugin's own answers (defined on AscendNPUPlatform).
PLUGIN = {
    "check_and_update_config", "check_if_supports_dtype", "check_runner_kv_caches_multi_layer",
    "device_control_env_var", "dispatch_key", "dist_backend", "get_attn_backend_cls",
    "get_current_memory_usage", "get_device_communicator_cls", "get_device_name",
    "get_device_total_memory", "get_static_graph_wrapper_cls", "is_pin_memory_available",
    "is_sleep_mode_available", "manual_seed_all", "num_compute_units", "opaque_attention_op",
    "ray_device_key", "ray_noset_device_env_vars", "register_triton_kernel_overrides",
    "set_device", "simple_compile_backend", "support_hybrid_kv_cache",
    "support_static_graph_mode", "supported_dtypes",
}

_ENUM = "answered by the platform enum (OOT): false for every vendor / capability predicate"
_NO_CUDA = "CUDA/ROCm feature flag: the base default (off / None) is the NPU's"
_GENERIC = "device-generic base behaviour, correct for any out-of-tree device"
_HOOK = "an optional hook: the base default (nothing to add) is the NPU's"
# vLLM's base defaults the NPU platform keeps, each with why.
BASE = {
    **dict.fromkeys(("is_cpu", "is_cuda", "is_cuda_alike", "is_rocm", "is_tpu", "is_xpu",
                     "is_out_of_tree", "is_unspecified", "is_zen_cpu", "is_integrated_gpu"),
                    _ENUM),
    **dict.fromkeys(("get_device_capability", "has_device_capability", "is_device_capability",
                     "is_device_capability_family", "is_arch_support_pdl", "is_fp8_fnuz",
                     "supports_fp8", "supports_mx", "support_deep_gemm", "fp8_dtype",
                     "is_cumem_allocator_available", "use_custom_allreduce",
                     "enable_multi_stream_overlap", "get_mla_prefill_backend_cls",
                     "get_nixl_memory_type", "get_nixl_supported_devices",
                     "uses_host_device_handling"), _NO_CUDA),
    **dict.fromkeys(("additional_env_vars", "apply_config_platform_defaults",
                     "get_default_ir_op_priority", "import_ir_kernels", "import_kernels",
                     "log_warnings", "pre_register_and_update", "register_custom_kv_cache_specs",
                     "set_additional_forward_context", "validate_environ", "validate_request",
                     "verify_model_arch", "verify_quantization", "get_supported_vit_attn_backends",
                     "get_vit_attn_backend", "supported_quantization", "pass_key",
                     "get_pass_manager_cls", "check_max_model_len", "get_max_output_tokens"),
                    _HOOK),
    **dict.fromkeys(("can_update_inplace", "device_control_id_to_physical_device_id",
                     "device_id_to_physical_device_id", "logical_device_id_to_visible_device_id",
                     "visible_device_id_to_physical_device_id", "get_cpu_architecture",
                     "get_compile_backend", "get_global_graph_pool", "make_synced_weight_loader",
                     "use_sync_weight_loader", "use_all_gather", "use_custom_op_collectives"),
                    _GENERIC),
    # the block-size step: vLLM's own, over the backends' declared sizes (FIA / SFA prefer
    # 128; test_startup.py runs it on this platform)
    "update_block_size_for_backend": "vLLM's step over the backends' preferred 128",
}
# Names vLLM reads through Platform.__getattr__, i.e. the device module (torch.npu on an
# Atlas host: torch_npu provides each).
DEVICE_MODULE = {"Event", "Stream", "current_device", "current_stream", "device_count",
                 "get_device_properties", "stream", "synchronize", "graph_pool_handle"}
# Names vLLM calls only on its own platforms' branches (guarded by is_cuda / is_rocm /
# is_cpu checks or called on CUDA/ROCm/CPU classes).
OTHER_PLATFORMS = {"_enum", "cudart", "device_name", "device_type",
                   "discover_numa_topology", "get_all_device_numa_nodes",
                   "get_cuda_runtime_major", "insert_blocks_to_device", "is_fully_connected",
                   "is_on_gfx9", "pack_kv_cache", "swap_out_blocks_to_host"}

# vllm-ascend's NPUPlatform (vllm_ascend/platform.py, commit 007f5b6b) overrides these;
# where the plugin does not, why.
VLLM_ASCEND = {
    "is_sleep_mode_available": "plugin: False (vLLM's sleep mode is CUDA's cumem allocator)",
    "pre_register_and_update": "base: nothing to patch (the plugin monkey-patches nothing)",
    "get_device_capability": "base: None, as vllm-ascend returns",
    "get_device_name": "plugin", "inference_mode": "plugin", "set_device": "plugin",
    "is_async_output_supported": "gone from vLLM 0.32's Platform",
    "empty_cache": "device module (torch.npu.empty_cache)",
    "synchronize": "device module (torch.npu.synchronize)",
    "mem_get_info": "device module (torch.npu.mem_get_info)",
    "clear_npu_memory": "vllm-ascend's own helper, not a vLLM hook",
    "check_and_update_config": "plugin", "get_attn_backend_cls": "plugin",
    "get_punica_wrapper": "refused: --enable-lora (platform/unanswered.py)",
    "get_current_memory_usage": "plugin", "get_device_communicator_cls": "plugin",
    "is_pin_memory_available": "plugin",
    "supports_v1": "gone from vLLM 0.32's Platform (V1 only)",
    "get_piecewise_backend_cls": "gone from vLLM 0.32's Platform; piecewise graphs are not "
                                 "offered (platform/graph_mode.py)",
    "stateless_init_device_torch_dist_pg": "refused: EPLB and elastic EP reach it",
}


def _called() -> dict[str, set[str]]:
    """``current_platform.<name>`` -> the vLLM files that use it (outside vllm/platforms)."""
    root = Path(vllm.__file__).parent
    out: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("platforms/"):
            continue
        for m in re.finditer(r"current_platform\.([A-Za-z_]\w*)", path.read_text(errors="ignore")):
            out.setdefault(m.group(1), set()).add(rel)
    return out


def _members() -> set[str]:
    return {n for cls in Platform.__mro__[:-1] for n in vars(cls)}


def _base_raises(name: str) -> bool:
    obj = inspect.getattr_static(Platform, name)
    try:
        source = inspect.getsource(getattr(obj, "__func__", obj))
    except (TypeError, OSError):
        return False
    return "raise NotImplementedError" in source


def test_every_platform_member_vllm_calls_has_an_answer():
    called = _called()
    members = {n for n in called if n in _members()}
    assert len(members) > 60, "the scan found too few names: it is broken"
    classified = PLUGIN | set(BASE) | set(unanswered.HOOKS)
    assert len(classified) == len(PLUGIN) + len(BASE) + len(unanswered.HOOKS)  # disjoint
    unknown = sorted(members - classified)
    assert not unknown, f"vLLM calls Platform members this test does not classify: {unknown}"
    stale = sorted(classified - members)
    assert not stale, f"classified but no longer called by vLLM: {stale}"
    others = sorted(set(called) - members)
    assert set(others) == DEVICE_MODULE | OTHER_PLATFORMS, others


def test_the_plugins_answers_are_its_own_and_no_base_hook_raises_unrefused():
    own = set(vars(AscendNPUPlatform))
    assert PLUGIN <= own, sorted(PLUGIN - own)
    for name in BASE:
        assert name not in own, f"{name} is the plugin's now: move it to PLUGIN"
        assert not _base_raises(name), f"{name}: vLLM's base raises; the NPU must answer"
    for name in unanswered.HOOKS:
        assert name not in own and _base_raises(name), name


@pytest.mark.parametrize("config,env,needle", [
    (SimpleNamespace(lora_config=object()), {}, "--enable-lora"),
    (SimpleNamespace(lora_config=None, load_config=SimpleNamespace(load_format="ipc_cache")),
     {}, "--load-format ipc_cache"),
    (SimpleNamespace(lora_config=None), {"VLLM_GPU_NIC_PCIE_MAPPING": "0:0000:1a:00.0"},
     "VLLM_GPU_NIC_PCIE_MAPPING"),
])
def test_each_option_reaching_an_unanswered_hook_is_refused_by_name(config, env, needle):
    with pytest.raises(AscendExtError, match=re.escape(needle)):
        unanswered.refuse(config, env)
    unanswered.refuse(SimpleNamespace(lora_config=None,
                                      load_config=SimpleNamespace(load_format="auto")), {})


def test_eplb_and_elastic_ep_which_reach_stateless_device_groups_are_refused():
    from vllm_ascend_ext.platform.config_hooks import refuse_expert_parallel

    for flag in ("enable_eplb", "enable_elastic_ep"):
        par = SimpleNamespace(enable_eplb=False, enable_elastic_ep=False,
                              enable_expert_parallel=True,
                              all2all_backend="allgather_reducescatter")
        setattr(par, flag, True)
        with pytest.raises(AscendExtError, match=flag.replace("_", "-")):
            refuse_expert_parallel(SimpleNamespace(parallel_config=par))


def test_side_by_side_with_vllm_ascend():
    own, members = set(vars(AscendNPUPlatform)), _members()
    for name, answer in VLLM_ASCEND.items():
        if answer == "plugin" or answer.startswith("plugin:"):
            assert name in own, name
        elif answer.startswith("base"):
            assert name in members and name not in own and not _base_raises(name), name
        elif answer.startswith("refused"):
            assert name in unanswered.HOOKS, name
        elif answer.startswith("gone"):
            assert name not in members, name
        elif answer.startswith("device module"):
            assert name not in members, name


def test_the_emulated_platform_overrides_only_its_named_exceptions():
    """Emulation runs the NPU platform: its class is an ``AscendNPUPlatform`` whose own
    members are exactly the named exceptions (the device, the chip, the start-up side),
    each with its reason; every other answer vLLM gets is the NPU platform's."""
    from vllm.platforms.cpu import CpuPlatform

    from vllm_ascend_ext.emulation.platform import EXCEPTIONS, EmulatedAscendPlatform

    assert issubclass(EmulatedAscendPlatform, AscendNPUPlatform)
    assert not issubclass(EmulatedAscendPlatform, CpuPlatform)
    own = {name for name in vars(EmulatedAscendPlatform)
           if not (name.startswith("__") and name.endswith("__"))}
    assert own == set(EXCEPTIONS), (sorted(own - set(EXCEPTIONS)),
                                    sorted(set(EXCEPTIONS) - own))
    assert all(why.strip() for why in EXCEPTIONS.values())
    # each member vLLM calls that the emulated platform changes is one the NPU platform
    # answers itself, a device attribute, or import_kernels, which extends vLLM's base
    # default (calls it) with the host allocator tuning: no base default silently replaced
    called = {n for n in own if not n.startswith("_")} & _members()
    npu_own = set(vars(AscendNPUPlatform))
    assert called <= npu_own | {"device_name", "device_type", "dispatch_key",
                                "dist_backend", "import_kernels"}, sorted(called - npu_own)
