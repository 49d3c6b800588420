"""Per-step metadata of the FIA backend: built once per step, read by every layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vllm_ascend_ext.attention.fia.split import Span


@dataclass(frozen=True)
class AscendFIAMetadata:
    num_actual_tokens: int  # real tokens (the runner may pad beyond this)
    num_reqs: int
    max_query_len: int
    max_seq_len: int
    causal: bool
    # Device tensors, sliced to the real requests / tokens, in plane ids
    # (attention/kv_layout.py: block b's K and V planes are plane_factor * b).
    block_table: torch.Tensor  # int32 [num_reqs, max_blocks]
    slot_indices: torch.Tensor  # int32 [num_actual_tokens], computed once per step
    # Host lists for FIA (SymInt[]): cumulative query ends, per-request kv lengths.
    actual_seq_lengths_q: tuple[int, ...]
    actual_seq_lengths_kv: tuple[int, ...]
    # Mixed steps the gate split: one FIA call per span (decode first); else None.
    split: tuple[Span, Span] | None = None
    plane_factor: int = 2  # K/V planes per cache block
    # On an NPU with decode graphs: the builder's FiaGraphTasks (graph_tasks.py), through
    # which a captured FIA call becomes a task updated on every replay; else None.
    graph_tasks: Any = None
