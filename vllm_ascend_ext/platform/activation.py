"""Whether the plugin's platform is active in this process's environment, and if not,
what is missing (cheap probes only, unless asked to verify the NPUs).

- ``emulation``: ``ASCEND_EXT_EMULATE`` asks for the emulated platform;
- ``npu``: torch_npu imports and sees at least one NPU;
- ``inactive``: neither, or ``VLLM_PLUGINS`` leaves the plugin out; ``why`` names what an
  Ascend host lacks (device nodes, torch_npu, a working driver) or, on an ordinary
  machine, ``ASCEND_EXT_EMULATE=1``.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass

from vllm_ascend_ext import PLUGIN_NAME, envs
from vllm_ascend_ext.platform import probe

EMULATE_HINT = f"set {envs.EMULATE}=1 to run the plugin emulated on this CPU"


@dataclass(frozen=True)
class Activation:
    mode: str     # "emulation", "npu" or "inactive"
    why: str

    @property
    def active(self) -> bool:
        return self.mode != "inactive"


def activation(verify: bool = False) -> Activation:
    """The platform this environment gets. With device nodes and torch_npu present, only
    ``verify`` imports torch_npu and asks for its device count (which loads the NPU
    driver: the CLI's front process and ``doctor`` do not)."""
    selected = os.environ.get("VLLM_PLUGINS")
    if selected is not None and PLUGIN_NAME not in [p.strip() for p in selected.split(",")]:
        return Activation("inactive", f"VLLM_PLUGINS={selected!r} does not load "
                          f"{PLUGIN_NAME}: add it (or unset VLLM_PLUGINS)")
    if envs.emulate_requested():
        return Activation("emulation", f"{envs.EMULATE}=1")
    devices, torch_npu = probe.npu_device_nodes(), probe.torch_npu_installed()
    if devices and torch_npu:
        error = _torch_npu_error() if verify else None
        if error is None:
            return Activation("npu", f"NPU device nodes ({', '.join(devices)}) and torch_npu"
                              + ("" if verify else " (not started here)"))
        return Activation("inactive", f"torch_npu sees no usable NPU ({error}; check "
                          "`npu-smi info` and `python -m vllm_ascend_ext doctor`), or "
                          f"{EMULATE_HINT}")
    if devices:
        return Activation("inactive", f"NPU device nodes ({', '.join(devices)}) but no "
                          "torch_npu: install the plugin's npu extra (README: quick start on an Atlas 800), "
                          f"or {EMULATE_HINT}")
    if torch_npu:
        return Activation("inactive", "torch_npu is installed but there are no /dev/davinci* "
                          "device nodes (no driver, or the devices are not mapped into this "
                          f"container), or {EMULATE_HINT}")
    return Activation("inactive", f"no Ascend NPU here: {EMULATE_HINT}")


def _torch_npu_error() -> str | None:
    try:
        count = importlib.import_module("torch_npu").npu.device_count()
    except Exception as exc:  # a broken driver install
        return f"importing it failed: {type(exc).__name__}: {exc}"
    return None if count > 0 else "device_count() is 0"
