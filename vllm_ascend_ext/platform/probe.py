"""Cheap, side-effect-free checks: is an Ascend NPU usable here?"""

from __future__ import annotations

import glob
import importlib
import importlib.util


def torch_npu_installed() -> bool:
    return importlib.util.find_spec("torch_npu") is not None


def npu_device_nodes() -> list[str]:
    """Ascend device nodes (``/dev/davinci0`` ...); empty on hosts without NPUs."""
    return sorted(p for p in glob.glob("/dev/davinci*") if p[len("/dev/davinci"):].isdigit())


def npu_present() -> bool:
    """True when torch_npu imports and reports at least one NPU.

    torch_npu is imported only when it is installed *and* device nodes exist, so
    on every other machine this costs a spec lookup and a glob.
    """
    if not torch_npu_installed() or not npu_device_nodes():
        return False
    try:
        torch_npu = importlib.import_module("torch_npu")
        return torch_npu.npu.device_count() > 0
    except Exception:  # a broken driver install means "no usable NPU"
        return False


def other_platform_plugins(own_name: str) -> list[str]:
    """Names of other installed ``vllm.platform_plugins`` entry points."""
    from importlib.metadata import entry_points

    return sorted(
        ep.name for ep in entry_points(group="vllm.platform_plugins") if ep.name != own_name
    )
