"""The compiled emulation kernels (``torch.ops._C_ascend_ext.emu_*``), when they can run.

Each hot Python reference has a C++ CPU kernel in ``_C_ascend_ext`` (``csrc/emu_*``)
with the same semantics; the reference stays the readable truth and the tests compare
the two. A reference uses its kernel when the library is loaded and has it, the tensors
are on the CPU, and ``ASCEND_EXT_PY_REFERENCE`` does not force the references.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend_ext import envs
from vllm_ascend_ext.ops import _ext


def emulation_kernel(name: str, device: torch.device) -> Callable[..., Any] | None:
    """``torch.ops._C_ascend_ext.<name>``, or None where the Python reference must run.
    Inside a compiled model's trace the library is not imported (Dynamo cannot trace an
    import): the emulated device's runtime loads it when it is brought up."""
    if device.type != "cpu" or envs.python_reference_forced():
        return None
    if not (_ext.loaded() if torch.compiler.is_compiling() else _ext.load()):
        return None
    return getattr(getattr(torch.ops, _ext.NAMESPACE), name, None)


# dtypes the layer-op kernels (``csrc/emu_layer_ops.cpp``) compute
LAYER_KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def trailing_contiguous(t: torch.Tensor, dims: int) -> bool:
    """Whether ``t``'s last ``dims`` dims are contiguous (its outer dims may be strided)."""
    expect = 1
    for size, stride in zip(reversed(t.shape[t.dim() - dims:]), reversed(t.stride()[t.dim() - dims:])):
        if size != 1 and stride != expect:
            return False
        expect *= size
    return True


def layer_kernel(name: str, dims: int, *tensors: torch.Tensor) -> Callable[..., Any] | None:
    """The layer-op kernel ``name`` where it takes ``tensors`` (a dtype it computes, their
    last ``dims`` dims contiguous), else None."""
    if not all(t.dtype in LAYER_KERNEL_DTYPES and trailing_contiguous(t, dims) for t in tensors):
        return None
    return emulation_kernel(name, tensors[0].device)


def vector_path() -> str | None:
    """Which vector path the kernels take on this CPU (``avx2`` / ``default``), or None
    without the library."""
    kernel = emulation_kernel("emu_vector_path", torch.device("cpu"))
    return kernel() if kernel is not None else None


def last_kernel_threads() -> int:
    """Threads the last FIA or GDN emulation kernel call ran its parallel region on: one
    body per thread of ``torch.get_num_threads()``, whatever the machine's load (0 before
    any; the layer-op kernels do not report)."""
    kernel = emulation_kernel("emu_last_threads", torch.device("cpu"))
    return kernel() if kernel is not None else 0
