"""Per-step metadata of the SFA backend: built once per step, read by every layer."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AscendSFAMetadata:
    num_actual_tokens: int          # real tokens of the step (padding excluded)
    num_reqs: int
    kind: str                       # "decode" | "prefill" | "mixed" (host-side, from CPU lengths)
    # Device tensors, derived once per step and shared by every layer:
    slot_indices: torch.Tensor      # int64 [T]: the cache writers' index dtype
    block_table: torch.Tensor       # int32 [B, max_blocks]
    cu_seqlens_q: torch.Tensor      # int32 [B]: cumulative query ends (TND)
    seq_lens: torch.Tensor          # int32 [B]: per-request KV lengths (PA_BSND)
    cos: torch.Tensor               # [T, Dr] half-duplicated, gathered from the rope cache
    sin: torch.Tensor               # [T, Dr]
