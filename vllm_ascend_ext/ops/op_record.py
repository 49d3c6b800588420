"""One NPU operator, declared once, in its own module: ``NpuOp``.

Each operator module declares its operators as ``NpuOp`` records (beside the functions
they name) and its entry function dispatches through the record (``OP.pick(device)``).
``ops/registry.py`` collects the records; the contract harness, doctor and the tests
read them there. A record holds everything about its operator but the contract's
documented rules, which it names (``rules``: contract mode looks them up; ``ops/`` never
imports ``contract/``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from vllm_ascend_ext.ops import _dispatch, _ext


@dataclass(frozen=True, eq=False)
class NpuOp:
    # torch_npu's name of the operator ("npu_rms_norm"); the plugin's own operators
    # (``torch_npu=False``): their name in the compiled library _C_ascend_ext
    name: str
    # the call on an NPU: torch_npu's operator (the call site contract mode checks), or
    # for the plugin's own operators what runs without their compiled library
    npu: Callable[..., Any]
    reference: Callable[..., Any]          # the pure-PyTorch semantics (the readable truth)
    meta: Callable[..., Any]               # shapes and dtypes only (graph capture, meta tests)
    # what the emulation runs on the CPU when it is not the reference itself: the compiled
    # kernel after the reference's checks (``kernel``), else the reference
    emulation: Callable[..., Any] | None = None
    kernel: str | None = None              # the compiled kernel in _C_ascend_ext, if any
    torch_npu: bool = True                 # False: the plugin's own op (contract mode skips it)
    # where contract mode finds the documented rules of the operator: the name of its rule
    # group in contract/op_rules.py (None: the docs give none beyond schema, meta, products)
    rules: str | None = None
    # the op counter counts a call of its entry once and none of the ATen operators its
    # reference runs (the entry is tagged ``counting.npu_op(counted_as)``); False: the
    # entry is untagged and the counter sees the reference's ATen operators (FIA)
    counted_once: bool = True

    @property
    def emulated(self) -> Callable[..., Any]:
        """What computes the operator on the CPU (and in contract mode, behind the checks)."""
        return self.emulation or self.reference

    @property
    def counted_as(self) -> str:
        """The name the op counter records a call under (``ops/counting.npu_op``)."""
        return self.name if self.torch_npu else f"{_ext.NAMESPACE}.{self.name}"

    def pick(self, device: torch.device) -> Callable[..., Any]:
        """The implementation for tensors on ``device`` (``ops/_dispatch.pick``)."""
        return _dispatch.pick(device, npu=self.npu, reference=self.emulated, meta=self.meta,
                              torch_npu_op=self.torch_npu)
