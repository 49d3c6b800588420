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


def k_stage(weights_mod, x, cos, sin, key_cache_rows, slots, *, index_head_dim, neox, eps):
    """One GEMM -> (key written to the cache, weights tail handed on)."""
    kw = weights_mod.wk_weights_proj(x)[0]                       # the only wk_weights_proj GEMM
    k, tail = kw.split([index_head_dim, kw.shape[-1] - index_head_dim], dim=-1)
    norm = weights_mod.k_norm
    k = F.layer_norm(k, (index_head_dim,), norm.weight, norm.bias, eps)
    k = rope_first(k, cos, sin, neox)
    key_cache_rows.index_put_((slots,), k.to(key_cache_rows.dtype))
    return IndexerTail(tail, x)


def topk_stage(weights_mod, x, q_c, tail: IndexerTail, cos, sin, key_cache, meta, *,
               n_heads, index_head_dim, topk, neox, wq_b_apply):
    """Indexer query, per-head weights and the top-k token selection."""
    if same_source(x, tail.source):
        w = tail.weights
    else:  # fallback: a different hidden-state tensor -> recompute the weights part only
        full = weights_mod.wk_weights_proj.weight
        w = F.linear(x, full[index_head_dim:])
    t = x.shape[0]
    q = wq_b_apply(q_c).view(t, n_heads, index_head_dim)
    q = rope_first(q, cos[:, None], sin[:, None], neox)
    weights = w * (n_heads ** -0.5 * index_head_dim ** -0.5)
    idx, _ = npu_lightning_indexer(
        q, key_cache, weights, actual_seq_lengths_query=meta.cu_seqlens_q,
        actual_seq_lengths_key=meta.seq_lens, block_table=meta.block_table,
        layout_query="TND", layout_key="PA_BSND", sparse_count=topk, sparse_mode=3)
    return idx
