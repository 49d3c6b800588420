"""The lightning indexer's per-layer path: K stage and top-k stage, one fused GEMM.

DeepSeek-V3.2's indexer projects the hidden states with one fused GEMM
``wk_weights_proj`` ([hidden] -> [Di + Ni]: the indexer key, then one weight per
indexer head). The K stage runs that GEMM, normalizes and rotates the key and
writes it into the cache; it hands the weights tail on. The top-k stage reuses
the tail when it is given the same hidden-state tensor, and otherwise (a caller
that hands the two stages different tensors, e.g. gathered vs local hidden states)
recomputes only the weights part, so the result is always right.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vllm_ascend_ext.ops.lightning_indexer import npu_lightning_indexer
from vllm_ascend_ext.ops.rope import deinterleave


@dataclass(frozen=True)
class IndexerSpec:
    n_heads: int                   # Ni
    head_dim: int                  # Di
    topk: int                      # index_topk
    neox: bool                     # RoPE convention of the indexer's rope part
    k_norm_eps: float = 1e-6


@dataclass(frozen=True)
class IndexerTail:
    weights: torch.Tensor          # [T, Ni] raw weights_proj output (the GEMM tail)
    source: torch.Tensor           # the hidden states it was computed from


def rope_first(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool) -> torch.Tensor:
    """RoPE on the first ``Dr`` dims of ``x`` [..., Di] (rope part first, as DeepSeek-V3.2)."""
    dr = cos.shape[-1]
    pe, rest = x[..., :dr], x[..., dr:]
    if not neox:  # interleaved pairs: de-interleave first (the shared permutation, §0.7)
        pe = deinterleave(pe)
    h = dr // 2
    rot = torch.cat((-pe[..., h:], pe[..., :h]), -1)
    return torch.cat((pe * cos + rot * sin, rest), -1)


def same_source(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a is b or (a.data_ptr() == b.data_ptr() and a.shape == b.shape
                      and a.stride() == b.stride() and a.dtype == b.dtype)


def k_stage(spec: IndexerSpec, ix, x, meta, key_cache) -> IndexerTail:
    """One GEMM -> (key written to the cache, weights tail handed on)."""
    kw = ix.wk_weights_proj(x)[0]                                # the only wk_weights_proj GEMM
    k, tail = kw.split([spec.head_dim, kw.shape[-1] - spec.head_dim], dim=-1)
    k = F.layer_norm(k, (spec.head_dim,), ix.k_norm.weight, ix.k_norm.bias, spec.k_norm_eps)
    k = rope_first(k, meta.cos, meta.sin, spec.neox)
    rows = key_cache.view(-1, spec.head_dim)                     # contiguous: a view
    rows.index_put_((meta.slot_indices,), k.to(rows.dtype))
    return IndexerTail(tail, x)


def topk_stage(spec: IndexerSpec, ix, x, q, tail: IndexerTail, meta, key_cache) -> torch.Tensor:
    """Per-head weights, the rotated indexer query ``q`` [T, Ni * Di], and the top-k
    token selection over the paged indexer keys."""
    if same_source(x, tail.source):
        w = tail.weights
    else:  # fallback: a different hidden-state tensor -> recompute the weights part only
        w = F.linear(x, ix.wk_weights_proj.weight[spec.head_dim:])
    q = rope_first(q.view(x.shape[0], spec.n_heads, spec.head_dim), meta.cos[:, None],
                   meta.sin[:, None], spec.neox)
    weights = w * (spec.n_heads ** -0.5 * spec.head_dim ** -0.5)
    idx, _ = npu_lightning_indexer(
        q, key_cache, weights, actual_seq_lengths_query=meta.cu_seqlens_q,
        actual_seq_lengths_key=meta.seq_lens, block_table=meta.block_table,
        layout_query="TND", layout_key="PA_BSND", sparse_count=spec.topk, sparse_mode=3)
    return idx
