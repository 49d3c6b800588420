"""vllm-ascend-ext: a vLLM platform plugin for Huawei Ascend NPUs.

Entry points only; importing this package has no side effects.
- ``platform_plugin`` (group ``vllm.platform_plugins``, name ``ascend_ext``)
- ``register`` (group ``vllm.general_plugins``, name ``ascend_ext``)
Both share the name, so ``VLLM_PLUGINS=ascend_ext`` selects the whole plugin.
"""

from __future__ import annotations

import logging

__version__ = "0.1.0"

PLUGIN_NAME = "ascend_ext"
NPU_PLATFORM = "vllm_ascend_ext.platform.npu.AscendNPUPlatform"
EMULATED_PLATFORM = "vllm_ascend_ext.emulation.platform.EmulatedAscendPlatform"
# vLLM's CPU worker on vLLM's CPU platform, for comparison (ASCEND_EXT_EMULATED_WORKER=cpu)
EMULATED_CPU_PLATFORM = "vllm_ascend_ext.emulation.cpu_platform.EmulatedCpuWorkerPlatform"

# Under vLLM's logger namespace so vLLM prints it.
_logger = logging.getLogger("vllm.ascend_ext")


def _coexistence_hint() -> None:
    import os

    from vllm_ascend_ext.platform.probe import other_platform_plugins

    others = other_platform_plugins(PLUGIN_NAME)
    if others and not os.environ.get("VLLM_PLUGINS"):
        _logger.warning(
            "ascend_ext: other vLLM platform plugins are installed (%s); vLLM refuses "
            "two active platform plugins. Set VLLM_PLUGINS=%s to use this plugin "
            "(or VLLM_PLUGINS=%s to use the other one).",
            ", ".join(others), PLUGIN_NAME, others[0],
        )


def platform_plugin() -> str | None:
    """vLLM platform-plugin entry point: a platform qualname, or None."""
    from vllm_ascend_ext import envs
    from vllm_ascend_ext.errors import AscendExtError
    from vllm_ascend_ext.platform.probe import npu_present

    try:
        emulate = envs.emulate_requested()
        cpu_worker = emulate and envs.emulated_worker() == "cpu"
    except AscendExtError as exc:  # vLLM swallows exceptions here: say it loudly first
        _logger.error("%s", exc)
        raise
    if emulate:
        chosen = EMULATED_CPU_PLATFORM if cpu_worker else EMULATED_PLATFORM
    elif npu_present():
        chosen = NPU_PLATFORM
    else:
        return None
    _coexistence_hint()
    return chosen


def register() -> None:
    """vLLM general-plugin entry point: registrations every process needs.

    Does nothing when the plugin's platform is not active, so an installed but
    inactive plugin leaves vLLM exactly as it was.
    """
    from vllm_ascend_ext import envs
    from vllm_ascend_ext.platform.probe import npu_present

    if not (envs.emulate_requested() or npu_present()):
        return
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    from vllm_ascend_ext.attention.fia.backend import BACKEND_NAME as FIA
    from vllm_ascend_ext.attention.sfa.backend import BACKEND_NAME as SFA
    from vllm_ascend_ext.contract import mode as contract_mode
    from vllm_ascend_ext.models import register_models
    from vllm_ascend_ext.moe.method import register as register_moe
    from vllm_ascend_ext.platform.selection import FIA_BACKEND_PATH, SFA_BACKEND_PATH
    from vllm_ascend_ext.quantization.config import register as register_quantization

    for name, path in ((FIA, FIA_BACKEND_PATH), (SFA, SFA_BACKEND_PATH)):
        if name not in AttentionBackendEnum.__members__:
            register_backend(name, path)
    register_quantization()
    register_models()
    # Contract mode's torch_npu stand-in, in every process (a spawned worker included)
    # before any operator runs; it raises on a bad ASCEND_EXT_NPU_CONTRACT value.
    contract_mode.enabled()
    register_moe()
    from vllm_ascend_ext.attention.gdn.layer import register as register_gdn

    register_gdn()
    from vllm_ascend_ext.layers import register as register_layer_ops

    register_layer_ops()
    from vllm_ascend_ext.ops._ext import report_if_missing

    report_if_missing()
