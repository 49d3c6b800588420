"""One step's metadata for the plugin's GDN layers (built once per step, shared by all).

Device tensors are built from host values (the builder's lists) and gathers of the
block table on the device; host fields are plain ints / bools. Tokens are laid out
recurrent span first, then prefill span (``token_order`` maps that layout to the
batch's tokens when the two are not already contiguous in that order).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class GdnSpan:
    num_reqs: int
    num_tokens: int
    max_len: int                         # host bound for the plugin's own recurrence op
    query_start_loc: torch.Tensor        # int32 [R+1], span-relative
    lengths: torch.Tensor                # int32 [R]
    slots: torch.Tensor                  # int32 [R]: each request's state slot (column 0)
    token_slots: torch.Tensor            # int32 [tokens]: per-token state slots
    has_initial_state: torch.Tensor      # bool [R]


@dataclass
class GdnMetadata:
    kind: str                            # "decode", "spec", "prefill", "spec+prefill", ...
    num_actual_tokens: int
    recurrent: GdnSpan | None
    prefill: GdnSpan | None
    speculative: bool
    # Speculative rows only: the request's slots (vLLM: block_table[:, :num_spec + 1]) and
    # the accepted counts of the previous step (device values, never read on the host).
    spec_slot_table: torch.Tensor | None = None   # int32 [R, num_spec + 1]
    num_accepted_tokens: torch.Tensor | None = None  # int32 [R]
    # Host decision: every verify row is full length, so the op's own accepted-token
    # offset can be used; otherwise the layer first moves each request's accepted state
    # into its column-0 slot on the device (the guard) and the op starts from column 0.
    accepted_in_op: bool = False
    token_order: torch.Tensor | None = None       # int64 [tokens] or None

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in (self.recurrent, self.prefill) if s is not None)
