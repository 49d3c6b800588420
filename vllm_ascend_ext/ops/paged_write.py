"""Writing token rows into a paged cache by int64 slot index (shared by the MLA-side ops).

Caches are ``[num_blocks, block_size, 1, D]`` and may be strided views (the SFA
backend keeps latent, rope and indexer key of one token in one cache row); the
write goes through the view. Negative slots (vLLM's padding slot -1) are skipped.
"""

from __future__ import annotations

import torch


def check_slots(op: str, index: torch.Tensor, tokens: int) -> None:
    if index.dtype != torch.int64:
        raise ValueError(f"{op}: cache index must be int64 (global slot ids), got {index.dtype}")
    if index.numel() != tokens:
        raise ValueError(f"{op}: {tokens} tokens but {index.numel()} cache indices")


def check_paged_cache(op: str, name: str, cache: torch.Tensor, width: int) -> None:
    if cache.dim() != 4 or cache.shape[2] != 1 or cache.shape[3] != width:
        raise ValueError(
            f"{op}: {name} must be a paged cache [num_blocks, block_size, 1, {width}], got "
            f"{tuple(cache.shape)}"
        )


def write_rows(cache: torch.Tensor, index: torch.Tensor, rows: torch.Tensor) -> None:
    """cache [nb, bs, 1, D] (any strides) <- rows [T, D] at slots index [T]."""
    idx = index.reshape(-1)
    keep = idx >= 0
    slots = idx[keep]
    bs = cache.shape[1]
    cache[slots // bs, slots % bs, 0] = rows.reshape(idx.numel(), -1)[keep].to(cache.dtype)
