"""``torch_npu.npu_sparse_flash_attention`` (SFA): MLA-absorbed attention over selected tokens.

Semantics (``docs/npu-ops.md`` §4.2, golden ``test_npu_sparse_flash_attention.py``):
per query token ``t`` (row ``i`` of request ``b``), the selected keys are the entries
of ``sparse_indices[t, 0]`` before the first -1 (logical positions in the request's
KV sequence), further restricted by ``sparse_mode=3`` to ``j <= Lkv - Lq + i``.
With ``attention_mode=2`` (MLA absorb; the only mode the kernel supports):

    s = scale_value * (query[t] . key[j] + query_rope[t] . key_rope[j])   per head
    out[t] = softmax(s) @ key[j]            (value = the latent, i.e. key itself)

``sinks`` [N1] (fp32) join the softmax max and denominator without a value. A token
with an empty selection outputs 0 [I]. fp32 accumulation, output in the query dtype.

Emulated: ``layout_query="TND"`` (cumulative int32 ``actual_seq_lengths_query``),
``layout_kv="PA_BSND"`` (per-request int32 ``actual_seq_lengths_kv``, int32
``block_table``), ``sparse_block_size=1`` (other powers of 2 up to 128 raise
NotImplementedError; values torch-npu refuses, and a zero-width ``sparse_indices``
(``sparse_size`` 0), raise ValueError); ``return_softmax_lse`` raises.
"""

from __future__ import annotations

import torch

from vllm_ascend_ext.ops._dispatch import torch_npu_module
from vllm_ascend_ext.ops.counting import npu_op
from vllm_ascend_ext.ops.op_record import NpuOp
from vllm_ascend_ext.ops.paged_read import gather_tokens, host_ints

OP = "npu_sparse_flash_attention"
MAX_SPARSE_BLOCK_SIZE = 128


def _check(query, key, value, sparse_indices, block_table, query_rope, key_rope,
           sparse_block_size, layout_query, layout_kv, sparse_mode, attention_mode,
           return_softmax_lse):
    if layout_query != "TND" or layout_kv != "PA_BSND":
        raise NotImplementedError(f"{OP}: layouts {layout_query}/{layout_kv} not emulated")
    if attention_mode != 2:
        raise ValueError(f"{OP}: attention_mode must be 2 (MLA absorb), got {attention_mode}")
    # torch-npu 2.13 docs: sparse_block_size takes [1, 128], a power of 2.
    sbs = int(sparse_block_size)
    if not 1 <= sbs <= MAX_SPARSE_BLOCK_SIZE or sbs & (sbs - 1):
        raise ValueError(f"{OP}: sparse_block_size must be a power of 2 in "
                         f"[1, {MAX_SPARSE_BLOCK_SIZE}], got {sparse_block_size}")
    if sbs != 1:
        raise NotImplementedError(
            f"{OP}: sparse_block_size {sparse_block_size} not emulated (1 only)")
    if sparse_mode not in (0, 3):
        raise ValueError(f"{OP}: sparse_mode must be 0 or 3, got {sparse_mode}")
    if return_softmax_lse:
        raise NotImplementedError(f"{OP}: return_softmax_lse (training) is not emulated")
    if value is not key and (value.data_ptr() != key.data_ptr() or value.shape != key.shape):
        raise ValueError(f"{OP}: key and value must be the same latent cache (attention_mode=2)")
    if query.dim() != 3 or key.dim() != 4 or key.shape[2] != 1 or key.shape[3] != query.shape[2]:
        raise ValueError(
            f"{OP}: query [T,N1,Dc] and key [nb,bs,1,Dc] required, got {tuple(query.shape)} / "
            f"{tuple(key.shape)}"
        )
    if query_rope is None or key_rope is None:
        raise ValueError(f"{OP}: query_rope and key_rope are required (attention_mode=2)")
    if tuple(query_rope.shape[:2]) != tuple(query.shape[:2]) or key_rope.shape[:3] != key.shape[:3]:
        raise ValueError(
            f"{OP}: query_rope {tuple(query_rope.shape)} / key_rope {tuple(key_rope.shape)} "
            "do not match query / key"
        )
    if sparse_indices.dim() != 3 or sparse_indices.shape[0] != query.shape[0] \
            or sparse_indices.dtype != torch.int32:
        raise ValueError(
            f"{OP}: sparse_indices must be int32 [T,1,K], got {sparse_indices.dtype} "
            f"{tuple(sparse_indices.shape)}"
        )
    # torch-npu 2.13 docs: sparse_indices is [Q_T, KV_N, sparse_size], sparse_size > 0
    # (a row that selects fewer keys is padded with -1, never narrowed to nothing).
    if sparse_indices.shape[-1] == 0:
        raise ValueError(
            f"{OP}: sparse_indices {tuple(sparse_indices.shape)}: its last dimension, "
            "sparse_size (the blocks selected per query token), must be > 0, got 0; "
            "pad unused entries with -1"
        )
    if block_table is None or block_table.dtype != torch.int32:
        raise ValueError(f"{OP}: an int32 block_table is required with PA_BSND")


def sparse_flash_attention_reference(query, key, value, sparse_indices, scale_value, *,
                                     block_table=None, actual_seq_lengths_query=None,
                                     actual_seq_lengths_kv=None, query_rope=None, key_rope=None,
                                     sparse_block_size=1, layout_query="BSND", layout_kv="BSND",
                                     sparse_mode=3, pre_tokens=2**63 - 1,
                                     next_tokens=2**63 - 1, attention_mode=0,
                                     return_softmax_lse=False, sinks=None):
    _check(query, key, value, sparse_indices, block_table, query_rope, key_rope,
           sparse_block_size, layout_query, layout_kv, sparse_mode, attention_mode,
           return_softmax_lse)
    cu_q = host_ints(actual_seq_lengths_query, "actual_seq_lengths_query", OP)
    lens_kv = host_ints(actual_seq_lengths_kv, "actual_seq_lengths_kv", OP)
    out = torch.zeros(query.shape, dtype=torch.float32, device=query.device)
    start = 0
    for b, end in enumerate(cu_q):
        lq, lkv = end - start, lens_kv[b]
        if lq > 0 and lkv > 0:
            kb = gather_tokens(key, block_table[b], lkv).float()                # [Lkv, Dc]
            krb = gather_tokens(key_rope, block_table[b], lkv).float()          # [Lkv, Dr]
            idx = sparse_indices[start:end, 0].long()                           # [Lq, K]
            valid = torch.cumprod((idx != -1).to(torch.int8), dim=-1).bool() & (idx < lkv)
            if sparse_mode == 3:
                i = torch.arange(lq, device=query.device)[:, None]
                valid &= idx <= i + (lkv - lq)
            sel = idx.clamp(0, lkv - 1)
            ks, krs = kb[sel], krb[sel]                                         # [Lq, K, D]
            s = (torch.einsum("qnd,qkd->qnk", query[start:end].float(), ks)
                 + torch.einsum("qnd,qkd->qnk", query_rope[start:end].float(), krs))
            s = (s * scale_value).masked_fill(~valid[:, None, :], float("-inf"))
            m = s.amax(-1, keepdim=True)
            if sinks is not None:
                m = torch.maximum(m, sinks.float()[None, :, None])
            m = m.clamp_min(-1e30)
            e = torch.exp(s - m)
            z = e.sum(-1, keepdim=True)
            if sinks is not None:
                z = z + torch.exp(sinks.float()[None, :, None] - m)
            out[start:end] = torch.einsum("qnk,qkd->qnd", e / z.clamp_min(1e-30), ks)
        start = end
    # The official meta's softmax max / sum outputs, empty unless return_softmax_lse.
    empty = query.new_empty(0, dtype=torch.float32)
    return out.to(query.dtype), empty, empty.clone()


def sparse_flash_attention_meta(query, key, value, sparse_indices, scale_value, *,
                                block_table=None, actual_seq_lengths_query=None,
                                actual_seq_lengths_kv=None, query_rope=None, key_rope=None,
                                sparse_block_size=1, layout_query="BSND", layout_kv="BSND",
                                sparse_mode=3, pre_tokens=2**63 - 1, next_tokens=2**63 - 1,
                                attention_mode=0, return_softmax_lse=False, sinks=None):
    _check(query, key, value, sparse_indices, block_table, query_rope, key_rope,
           sparse_block_size, layout_query, layout_kv, sparse_mode, attention_mode,
           return_softmax_lse)
    return (torch.empty_like(query), query.new_empty(0, dtype=torch.float32),
            query.new_empty(0, dtype=torch.float32))


def sparse_flash_attention_npu(query, key, value, sparse_indices, scale_value, **kw):
    return torch_npu_module().npu_sparse_flash_attention(query, key, value, sparse_indices,
                                                         scale_value, **kw)


@npu_op(OP)
def npu_sparse_flash_attention(query, key, value, sparse_indices, scale_value, *,
                               block_table=None, actual_seq_lengths_query=None,
                               actual_seq_lengths_kv=None, query_rope=None, key_rope=None,
                               sparse_block_size=1, layout_query="BSND", layout_kv="BSND",
                               sparse_mode=3, pre_tokens=2**63 - 1, next_tokens=2**63 - 1,
                               attention_mode=0, return_softmax_lse=False, sinks=None):
    impl = SPARSE_FLASH_ATTENTION.pick(query.device)
    return impl(query, key, value, sparse_indices, scale_value, block_table=block_table,
                actual_seq_lengths_query=actual_seq_lengths_query,
                actual_seq_lengths_kv=actual_seq_lengths_kv, query_rope=query_rope,
                key_rope=key_rope, sparse_block_size=sparse_block_size,
                layout_query=layout_query, layout_kv=layout_kv, sparse_mode=sparse_mode,
                pre_tokens=pre_tokens, next_tokens=next_tokens, attention_mode=attention_mode,
                return_softmax_lse=return_softmax_lse, sinks=sinks)


SPARSE_FLASH_ATTENTION = NpuOp(OP, npu=sparse_flash_attention_npu,
                               reference=sparse_flash_attention_reference,
                               meta=sparse_flash_attention_meta, rules="SFA_RULES")
