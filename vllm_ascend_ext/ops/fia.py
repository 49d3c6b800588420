"""``torch_npu.npu_fused_infer_attention_score`` (FIA): NPU call, reference, meta.

Semantics: ``shared/npu-ops.md`` section 1 (TND layout, cumulative
``actual_seq_lengths``, per-request ``actual_seq_lengths_kv`` with a block table,
cumulative without; ``sparse_mode`` 0/2/3/4 with the 2048x2048 compressed mask
whose content is a per-tile template; GQA with contiguous head groups; fp32
accumulation, output cast to the query dtype; fully masked rows give 0).

The reference is vectorized over the batch: requests are bucketed by query length
(powers of two) and each bucket is one padded, masked attention. The Python loop
runs over buckets and row tiles, never over requests, so emulation keeps up with
vLLM's own CPU kernels.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vllm_ascend_ext.ops._dispatch import pick, torch_npu_module
from vllm_ascend_ext.ops.fia_checks import UNSUPPORTED_OPTIONALS, FIAPlan, check_fia

INT_MAX = 2147483647
# Upper bound on score elements materialized at once by the reference (fp32).
_SCORE_BUDGET = 1 << 24


def _bucket(q_len: int) -> int:
    return 1 if q_len <= 1 else 1 << (q_len - 1).bit_length()


def _visible(i, j, q_len, kv_len, sparse_mode, mask2d, pre, nxt):
    """Visibility [g, rows, cols] for query rows i, key columns j of each request."""
    off = kv_len - q_len
    vis = (j < kv_len) & (i < q_len)
    if sparse_mode == 3:
        vis &= j <= i + off
    elif sparse_mode == 2:
        vis &= j <= i
    elif sparse_mode == 4:
        vis &= (j >= i + off - pre) & (j <= i + off + nxt)
    elif mask2d is not None:  # mode 0 with an explicit mask: 1/True = masked
        rows = i.clamp(max=mask2d.shape[0] - 1)
        cols = j.clamp(max=mask2d.shape[1] - 1)
        in_mask = (i < mask2d.shape[0]) & (j < mask2d.shape[1])
        vis &= in_mask & (mask2d[rows, cols] == 0)
        vis &= (j - i <= nxt) & (i - j <= pre)
    return vis


def _gather_kv(t: torch.Tensor, plan: FIAPlan, reqs: list[int], kv_pad: int,
               block_table, device) -> torch.Tensor:
    """K or V rows of each request of a bucket: [g, kv_pad, KV_N, D] (fp32).

    Paged caches are indexed by (block, offset), never flattened: the cache views
    are strided across blocks and a reshape would copy the whole cache.
    """
    j = torch.arange(kv_pad, device=device)
    if plan.paged:
        bs = plan.block_size
        blk_idx = (j // bs).clamp(max=block_table.shape[1] - 1)
        blocks = block_table[torch.tensor(reqs, device=device)][:, blk_idx].long()
        off = (j % bs).expand_as(blocks)
        if t.dim() == 4:  # BnNBsD (nb, KV_N, bs, D): advanced dims come first
            return t[blocks, :, off].float()
        return t[blocks, off].view(len(reqs), kv_pad, plan.num_kv_heads, -1).float()
    starts = torch.tensor([plan.cu_kv[b] for b in reqs], device=device)
    rows = (starts[:, None] + j).clamp(max=max(plan.cu_kv[-1] - 1, 0))
    return t[rows].float()


def fia_reference(
    query, key, value, *, atten_mask=None, actual_seq_lengths=None,
    actual_seq_lengths_kv=None, block_table=None, num_heads=1, scale=1.0,
    pre_tokens=INT_MAX, next_tokens=INT_MAX, input_layout="BSH",
    num_key_value_heads=0, sparse_mode=0, inner_precise=0, block_size=0,
    softmax_lse_flag=False, **optionals,
):
    plan = _check(query, key, value, atten_mask, actual_seq_lengths,
                  actual_seq_lengths_kv, block_table, num_heads, input_layout,
                  num_key_value_heads, sparse_mode, block_size, optionals)
    device = query.device
    T, N, D = plan.num_tokens, plan.num_heads, plan.head_size
    kvh = plan.num_kv_heads
    G = N // kvh
    out = torch.zeros(T, N, plan.value_head_size, dtype=torch.float32, device=device)
    lse = torch.full((T, N, 1), float("-inf"), dtype=torch.float32, device=device)
    mask2d = None
    if sparse_mode == 0 and atten_mask is not None:
        mask2d = atten_mask.reshape(-1, *atten_mask.shape[-2:])[0]

    buckets: dict[int, list[int]] = {}
    for b, lq in enumerate(plan.q_lens):
        if lq > 0:
            buckets.setdefault(_bucket(lq), []).append(b)
    if key.shape[0] == 0:  # empty K/V: every row is fully masked -> zeros
        buckets = {}
    for reqs in buckets.values():
        q_pad = max(plan.q_lens[b] for b in reqs)
        kv_pad = max(max(plan.kv_lens[b] for b in reqs), 1)
        k = _gather_kv(key, plan, reqs, kv_pad, block_table, device)  # [g, kv_pad, kvh, D]
        v = _gather_kv(value, plan, reqs, kv_pad, block_table, device)
        q_len = torch.tensor([plan.q_lens[b] for b in reqs], device=device)[:, None, None]
        kv_len = torch.tensor([plan.kv_lens[b] for b in reqs], device=device)[:, None, None]
        q_start = torch.tensor([plan.cu_q[b] for b in reqs], device=device)[:, None]
        tile = max(1, min(q_pad, _SCORE_BUDGET // max(1, len(reqs) * N * kv_pad)))
        j = torch.arange(kv_pad, device=device)[None, None, :]
        for r0 in range(0, q_pad, tile):
            r = torch.arange(r0, min(q_pad, r0 + tile), device=device)
            tok = (q_start + r).clamp(max=T - 1)  # [g, rows]
            q = query[tok].float().view(len(reqs), -1, kvh, G, D)
            s = torch.einsum("bqngd,bknd->bngqk", q, k) * scale
            vis = _visible(r[None, :, None], j, q_len, kv_len, sparse_mode, mask2d,
                           pre_tokens, next_tokens)[:, None, None]
            s = s.masked_fill(~vis, float("-inf"))
            m = s.amax(-1, keepdim=True).clamp_min(-1e30)
            e = torch.exp(s - m)
            z = e.sum(-1, keepdim=True)
            o = torch.einsum("bngqk,bknd->bqngd", e / z.clamp_min(1e-30), v)
            row_lse = (m + z.log()).squeeze(-1).permute(0, 3, 1, 2)  # [g, rows, kvh, G]
            valid = (r[None, :] < q_len[:, :, 0]).reshape(-1)
            flat_tok = tok.reshape(-1)[valid]
            out[flat_tok] = o.reshape(-1, N, plan.value_head_size)[valid]
            lse[flat_tok] = row_lse.reshape(-1, N, 1)[valid]
    attn = out.to(query.dtype)
    if softmax_lse_flag:
        return attn, lse
    return attn, torch.zeros(1, dtype=torch.float32, device=device)


def fia_meta(
    query, key, value, *, atten_mask=None, actual_seq_lengths=None,
    actual_seq_lengths_kv=None, block_table=None, num_heads=1, scale=1.0,
    pre_tokens=INT_MAX, next_tokens=INT_MAX, input_layout="BSH",
    num_key_value_heads=0, sparse_mode=0, inner_precise=0, block_size=0,
    softmax_lse_flag=False, **optionals,
):
    plan = _check(query, key, value, atten_mask, actual_seq_lengths,
                  actual_seq_lengths_kv, block_table, num_heads, input_layout,
                  num_key_value_heads, sparse_mode, block_size, optionals)
    out = query.new_empty(plan.num_tokens, plan.num_heads, plan.value_head_size)
    if softmax_lse_flag:
        lse = query.new_empty(plan.num_tokens, plan.num_heads, 1, dtype=torch.float32)
    else:
        lse = query.new_empty(1, dtype=torch.float32)
    return out, lse


def fia_npu(query, key, value, **kwargs):
    return torch_npu_module().npu_fused_infer_attention_score(query, key, value, **kwargs)


def _check(query, key, value, atten_mask, actual_seq_lengths, actual_seq_lengths_kv,
           block_table, num_heads, input_layout, num_key_value_heads, sparse_mode,
           block_size, optionals) -> FIAPlan:
    unknown = set(optionals) - set(UNSUPPORTED_OPTIONALS)
    if unknown:
        raise TypeError(f"npu_fused_infer_attention_score: unexpected arguments {sorted(unknown)}")
    return check_fia(
        query, key, value, atten_mask=atten_mask, actual_seq_lengths=actual_seq_lengths,
        actual_seq_lengths_kv=actual_seq_lengths_kv, block_table=block_table,
        num_heads=num_heads, input_layout=input_layout,
        num_key_value_heads=num_key_value_heads, sparse_mode=sparse_mode,
        block_size=block_size, unsupported=optionals,
    )


def npu_fused_infer_attention_score(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
    atten_mask: torch.Tensor | None = None,
    actual_seq_lengths: Sequence[int] | None = None,
    actual_seq_lengths_kv: Sequence[int] | None = None,
    block_table: torch.Tensor | None = None,
    num_heads: int = 1, scale: float = 1.0,
    pre_tokens: int = INT_MAX, next_tokens: int = INT_MAX,
    input_layout: str = "BSH", num_key_value_heads: int = 0, sparse_mode: int = 0,
    inner_precise: int = 0, block_size: int = 0, softmax_lse_flag: bool = False,
    **optionals,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same signature and semantics as the torch_npu operator (keyword arguments)."""
    impl = pick(query.device, npu=fia_npu, reference=fia_reference, meta=fia_meta)
    return impl(
        query, key, value, atten_mask=atten_mask, actual_seq_lengths=actual_seq_lengths,
        actual_seq_lengths_kv=actual_seq_lengths_kv, block_table=block_table,
        num_heads=num_heads, scale=scale, pre_tokens=pre_tokens, next_tokens=next_tokens,
        input_layout=input_layout, num_key_value_heads=num_key_value_heads,
        sparse_mode=sparse_mode, inner_precise=inner_precise, block_size=block_size,
        softmax_lse_flag=softmax_lse_flag, **optionals,
    )


def causal_mask_2048(device: torch.device | str = "cpu") -> torch.Tensor:
    """The canonical compressed causal mask (1 = masked) that sparse_mode 2/3/4 take."""
    return torch.triu(torch.ones(2048, 2048, dtype=torch.int8, device=device), diagonal=1)
