"""One GDN layer's core per step: conv, gates, recurrence; state updated in place.

Inputs are the layer's projected ``mixed_qkv`` ``[T, 2*key_dim + value_dim]`` and the
gate inputs ``b``, ``a`` ``[T, Nv]``; the result goes to ``out`` ``[T, Nv, Dv]`` (rows
past the step's tokens are left as they are). Everything per step that is not tensor
math comes from ``GdnMetadata`` (host ints / flags and device index tensors); nothing here
reads device data on the host, and the same code runs on ``meta`` tensors.

Speculative decoding (vLLM's slot scheme): a verify row's token ``t`` leaves its state in
the request's slot column ``t``; the next step resumes from column ``accepted - 1``. When
every verify row is full length the recurrence op applies that offset itself
(``num_accepted_tokens``); otherwise (ngram: ragged drafts, a row shorter than last
step's accepted count) the **guard** runs first, on the device, per request: copy the
state of column ``accepted - 1`` into column 0, then start every row from column 0. A
request that accepted no draft copies column 0 onto itself: its state is exactly what a
plain decode step would have left. The conv state is one slot per request whose window
offset is the accepted count (``npu_causal_conv1d_ext``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_ascend_ext.attention.gdn.metadata import GdnMetadata, GdnSpan
from vllm_ascend_ext.attention.gdn.ops_table import CHUNK, GdnOps
from vllm_ascend_ext.ops.causal_conv1d import npu_causal_conv1d_ext
from vllm_ascend_ext.ops.gdn_chunk import npu_chunk_gated_delta_rule
from vllm_ascend_ext.ops.gdn_ext import npu_recurrent_gated_delta_rule_ext
from vllm_ascend_ext.ops.gdn_gating import gdn_gates, l2norm
from vllm_ascend_ext.ops.gdn_recurrent import npu_recurrent_gated_delta_rule


@dataclass(frozen=True)
class GdnDims:
    num_k_heads: int      # per rank
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim


@dataclass(frozen=True)
class GdnWeights:
    conv_weight: torch.Tensor          # [K, conv_dim] (a view of the layer's weight)
    conv_bias: torch.Tensor | None
    a_log: torch.Tensor                # [Nv]
    dt_bias: torch.Tensor              # [Nv]
    silu: bool


def apply_accepted_guard(ssm_state: torch.Tensor, slot_table: torch.Tensor,
                         accepted: torch.Tensor) -> None:
    """Per request, on the device: state[column 0] = state[column accepted - 1]."""
    src = slot_table.long().gather(1, (accepted.long() - 1).clamp_min(0).unsqueeze(1)).squeeze(1)
    ssm_state.index_copy_(0, slot_table[:, 0].long(), ssm_state.index_select(0, src))


def _qkv(y: torch.Tensor, dims: GdnDims):
    q, k, v = torch.split(y, [dims.key_dim, dims.key_dim, dims.value_dim], dim=-1)
    n = y.shape[0]
    q = l2norm(q.reshape(n, dims.num_k_heads, dims.head_k_dim))
    k = l2norm(k.reshape(n, dims.num_k_heads, dims.head_k_dim))
    return q, k, v.reshape(n, dims.num_v_heads, dims.head_v_dim)


def _recurrent(span: GdnSpan, md: GdnMetadata, ops: GdnOps, x, g, beta, w: GdnWeights,
               conv_state, ssm_state, dims: GdnDims, scale: float) -> torch.Tensor:
    accepted = md.num_accepted_tokens if md.speculative else None
    y = npu_causal_conv1d_ext(x, w.conv_weight, conv_state, span.query_start_loc, span.slots,
                              span.has_initial_state, bias=w.conv_bias,
                              num_accepted_tokens=accepted, silu=w.silu)
    q, k, v = _qkv(y, dims)
    if md.speculative and not md.accepted_in_op:
        apply_accepted_guard(ssm_state, md.spec_slot_table, md.num_accepted_tokens)
        accepted = None
    if ops.torch_npu_recurrence:
        if ssm_state.is_contiguous():
            return npu_recurrent_gated_delta_rule(
                q, k, v, ssm_state, beta=beta, scale=scale, actual_seq_lengths=span.lengths,
                ssm_state_indices=span.token_slots, num_accepted_tokens=accepted, g=g)
        # vLLM's hybrid pages interleave each block's conv and recurrent state, so the
        # recurrent states are a strided view; the kernel updates its state in place and
        # takes contiguous memory only. Stage the span's slots (one per token), run on
        # positions, write them back.
        slots = span.token_slots.long()
        staged = ssm_state.index_select(0, slots)
        positions = torch.arange(span.num_tokens, dtype=torch.int32, device=slots.device)
        out = npu_recurrent_gated_delta_rule(
            q, k, v, staged, beta=beta, scale=scale, actual_seq_lengths=span.lengths,
            ssm_state_indices=positions, num_accepted_tokens=accepted, g=g)
        ssm_state.index_copy_(0, slots, staged)
        return out
    return npu_recurrent_gated_delta_rule_ext(
        q, k, v, ssm_state, beta=beta, scale=scale, actual_seq_lengths=span.lengths,
        ssm_state_indices=span.token_slots, num_accepted_tokens=accepted, g=g,
        max_seq_len=span.max_len)


def _prefill(span: GdnSpan, ops: GdnOps, x, g, beta, w: GdnWeights, conv_state, ssm_state,
             dims: GdnDims, scale: float) -> torch.Tensor:
    y = npu_causal_conv1d_ext(x, w.conv_weight, conv_state, span.query_start_loc, span.slots,
                              span.has_initial_state, bias=w.conv_bias, silu=w.silu)
    q, k, v = _qkv(y, dims)
    if ops.prefill == CHUNK:
        slots = span.slots.long()
        start = ssm_state.index_select(0, slots)
        start = torch.where(span.has_initial_state.view(-1, 1, 1, 1), start,
                            torch.zeros_like(start))
        out, final = npu_chunk_gated_delta_rule(
            q, k, v, beta=beta, initial_state=start, actual_seq_lengths=span.lengths,
            scale=scale, g=g)
        ssm_state.index_copy_(0, slots, final.to(ssm_state.dtype))
        return out
    return npu_recurrent_gated_delta_rule_ext(
        q, k, v, ssm_state, beta=beta, scale=scale, actual_seq_lengths=span.lengths,
        ssm_state_indices=span.token_slots, g=g, has_initial_state=span.has_initial_state,
        max_seq_len=span.max_len)


def gdn_core(md: GdnMetadata, ops: GdnOps, dims: GdnDims, w: GdnWeights,
             conv_state: torch.Tensor, ssm_state: torch.Tensor, mixed_qkv: torch.Tensor,
             b: torch.Tensor, a: torch.Tensor, out: torch.Tensor) -> None:
    """``conv_state`` ``[N, state_len, conv_dim]`` (a view), ``ssm_state`` ``[N, Nv, Dv, Dk]``."""
    n = md.num_tokens
    if n == 0:
        return
    x, bb, aa = mixed_qkv[:n], b[:n], a[:n]
    if md.token_order is not None:
        x, bb, aa = (t.index_select(0, md.token_order) for t in (mixed_qkv, b, a))
    g, beta = gdn_gates(aa, bb, w.a_log, w.dt_bias)
    scale = dims.head_k_dim ** -0.5
    parts = []
    if md.recurrent is not None:
        r = md.recurrent.num_tokens
        parts.append(_recurrent(md.recurrent, md, ops, x[:r], g[:r], beta[:r], w, conv_state,
                                ssm_state, dims, scale))
    if md.prefill is not None:
        r = md.recurrent.num_tokens if md.recurrent is not None else 0
        parts.append(_prefill(md.prefill, ops, x[r:], g[r:], beta[r:], w, conv_state,
                              ssm_state, dims, scale))
    res = parts[0] if len(parts) == 1 else torch.cat(parts)
    if md.token_order is not None:
        out.index_copy_(0, md.token_order, res.to(out.dtype))
    else:
        out[:n] = res.to(out.dtype)
