"""Which implementation of an NPU operator runs: decided by the tensors' device.

- ``npu``: the torch_npu operator (imported lazily; only ever on an NPU host);
- ``meta``: the shape-only implementation (graph capture, and tests proving the
  per-step path never reads device data on the host);
- anything else (``cpu`` in emulation): the pure-PyTorch reference.

No global switch: the backend calls one function and never knows which runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch


def torch_npu_module() -> Any:
    """torch_npu, imported on first use (raises ImportError off an NPU host)."""
    return importlib.import_module("torch_npu")


def pick(
    device: torch.device,
    *,
    npu: Callable[..., Any],
    reference: Callable[..., Any],
    meta: Callable[..., Any],
) -> Callable[..., Any]:
    if device.type == "meta":
        return meta
    if device.type == "npu":
        return npu
    return reference
