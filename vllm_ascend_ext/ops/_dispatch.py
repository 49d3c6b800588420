"""Which implementation of an NPU operator runs: decided by the tensors' device.

- ``npu``: the torch_npu operator (imported lazily; only ever on an NPU host);
- ``meta``: the shape-only implementation (graph capture, and tests proving the
  per-step path never reads device data on the host);
- anything else (``cpu`` in emulation): the pure-PyTorch reference, or, in contract mode
  (``ASCEND_EXT_NPU_CONTRACT=1``), the NPU call site itself, with the contract harness
  standing in for torch_npu (it validates the call and computes it by reference).

The backend calls one function and never knows which runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend_ext.contract import mode as contract_mode
from vllm_ascend_ext.worker.cpu_npu_graph import as_kernel


def torch_npu_module() -> Any:
    """torch_npu, imported on first use (raises ImportError off an NPU host); in contract
    mode the harness's stand-in namespace."""
    if contract_mode.enabled():
        return contract_mode.harness().namespace
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
    impl = npu if torch_npu_op and contract_mode.enabled() else reference
    # Emulated decode graphs: one operator call is one recorded kernel (worker/cpu_npu_graph.py)
    return as_kernel(impl)
