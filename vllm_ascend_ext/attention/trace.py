"""Named profiler ranges around the backends' operator calls, free when nothing records.

A ``record_function`` enters and leaves an ATen op even with no profiler running
(~10 us a range on the CPU; two or three ranges per layer per step): the ranges are
opened only while a torch profiler is active, and then carry the same names.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch
from torch.profiler import record_function

_NO_RANGE = nullcontext()


def trace_range(name: str) -> AbstractContextManager:
    """``record_function(name)`` while a torch profiler records, else a no-op context."""
    if torch._C._autograd._profiler_enabled():
        return record_function(name)
    return _NO_RANGE
