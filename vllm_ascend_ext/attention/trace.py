"""Named profiler ranges around the backends' operator calls, free when nothing records.

A ``record_function`` enters and leaves an ATen op even with no profiler running
(~10 us a range on the CPU; two or three ranges per layer per step): in emulation the
ranges are opened only while torch's profiler is active. On an NPU they are always
opened (torch_npu's profiler keeps its own state, which this check would not see).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch
from torch.profiler import record_function

_NO_RANGE = nullcontext()


def trace_range(name: str, device: torch.device) -> AbstractContextManager:
    """``record_function(name)``; on the CPU only while torch's profiler records."""
    if device.type != "cpu" or torch._C._autograd._profiler_enabled():
        return record_function(name)
    return _NO_RANGE
