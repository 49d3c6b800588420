"""Host-side helpers shared by the sparse-attention references: lengths and paged gathers."""

from __future__ import annotations

import torch


def host_ints(t: torch.Tensor | None, name: str, op: str) -> list[int]:
    """A small int tensor as a host list (the references run on the CPU only)."""
    if t is None:
        raise ValueError(f"{op}: {name} is required")
    if t.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{op}: {name} must be an int32 tensor, got {t.dtype}")
    return [int(v) for v in t.reshape(-1).tolist()]


def gather_tokens(cache: torch.Tensor, table_row: torch.Tensor, length: int) -> torch.Tensor:
    """Logical tokens 0..length-1 of one request from a paged [nb, bs, 1, D] cache -> [length, D]."""
    bs = cache.shape[1]
    p = torch.arange(length, device=cache.device)
    blocks = table_row[p // bs].long()
    return cache[blocks, p % bs, 0]
