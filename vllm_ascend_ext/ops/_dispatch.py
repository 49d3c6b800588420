"""Which implementation of an NPU operator runs: decided by the tensors' device.

- ``npu``: the torch_npu operator (imported lazily; only ever on an NPU host);
- ``meta``: the shape-only implementation (graph capture, and tests proving the
  per-step path never reads device data on the host);
- anything else (``cpu`` in emulation): the pure-PyTorch reference, or, in contract mode
  (``ASCEND_EXT_NPU_CONTRACT=1``), the NPU call site itself, with a stand-in for torch_npu
  (the contract harness, which validates the call and computes it by reference).

The backend calls one function and never knows which runs. This module knows nothing
of the contract nor of the emulated NPU runtime, which install themselves here:

- contract mode its torch_npu stand-in (``install_stand_in``) when it is enabled
  (``contract/mode.py``);
- the CPU stand-in of the NPU runtime its graph recorder's kernel wrapper
  (``install_kernel_wrapper``) when the runtime is brought up (``emulation/cpu_npu.py``):
  while an emulated decode graph is captured, one operator call is one recorded kernel
  (``worker/cpu_npu_graph.as_kernel``). Without one, the implementation runs as it is.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend_ext import envs
from vllm_ascend_ext.errors import AscendExtError

# The provider of the process's torch_npu stand-in (at most one), installed by contract mode.
_STAND_IN: list[Callable[[], Any]] = []
# What wraps the implementation a CPU call gets (at most one), installed by the emulated
# NPU runtime: ``impl -> what the call site calls``.
_KERNEL_WRAPPER: list[Callable[..., Callable[..., Any]]] = []


def install_stand_in(provider: Callable[[], Any]) -> None:
    """Make ``provider()`` what NPU call sites get for torch_npu while
    ``ASCEND_EXT_NPU_CONTRACT=1`` (replaces an earlier one)."""
    _STAND_IN[:] = [provider]


def install_kernel_wrapper(wrapper: Callable[..., Callable[..., Any]]) -> None:
    """Make ``wrapper(impl, meta)`` what ``pick`` returns for CPU tensors instead of
    ``impl`` (``meta``: the operator's shape-only implementation; replaces an earlier
    one; idempotent)."""
    _KERNEL_WRAPPER[:] = [wrapper]


def torch_npu_module() -> Any:
    """torch_npu, imported on first use (raises ImportError off an NPU host); in contract
    mode the installed stand-in."""
    if envs.npu_contract():
        if not _STAND_IN:
            raise AscendExtError(
                f"{envs.NPU_CONTRACT}=1, but no torch_npu stand-in is installed in this "
                "process: contract mode installs its harness when it is enabled "
                "(vllm_ascend_ext.contract.mode.enabled())")
        return _STAND_IN[0]()
    return importlib.import_module("torch_npu")


def pick(
    device: torch.device,
    *,
    npu: Callable[..., Any],
    reference: Callable[..., Any],
    meta: Callable[..., Any],
    torch_npu_op: bool = True,
) -> Callable[..., Any]:
    """``torch_npu_op=False`` for the plugin's own operators (``_C_ascend_ext``): contract
    mode, which checks torch_npu call sites, leaves them on their reference."""
    if device.type == "meta":
        return meta
    if device.type == "npu":
        return npu
    impl = npu if torch_npu_op and envs.npu_contract() else reference
    # Emulated decode graphs: one operator call is one recorded kernel (install_kernel_wrapper)
    return _KERNEL_WRAPPER[0](impl, meta) if _KERNEL_WRAPPER else impl
