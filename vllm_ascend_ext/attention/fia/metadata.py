"""Per-step metadata of the FIA backend: built once per step, read by every layer.

``spans`` are the step's FIA calls, decided by the builder: one for a step issued as a
single call (every decode-only step, hence every captured graph step), (decode, prefill)
for a mixed step the gate split, none for a step without tokens. The forward writes K/V
once, then issues one FIA call per span into that span's rows of the output.
"""

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
    # The step's host lists (SymInt[]): cumulative query ends, per-request kv lengths
    # (a decode graph's tasks are updated with these before a replay).
    actual_seq_lengths_q: tuple[int, ...]
    actual_seq_lengths_kv: tuple[int, ...]
    # One FIA call per span, in order, each with its rows, requests and host lists.
    spans: tuple[Span, ...]
    plane_factor: int = 2  # K/V planes per cache block
    # On an NPU with decode graphs: the builder's FiaGraphTasks (graph_tasks.py), through
    # which a captured FIA call becomes a task updated on every replay; else None.
    graph_tasks: Any = None
