"""``torch_npu.npu_lightning_indexer``: DeepSeek-V3.2 top-k token selection.

Semantics (``docs/npu-ops.md`` §4.1, golden ``test_npu_lightning_indexer.py``):
per query token ``t`` of request ``b``, over the request's visible keys
``j`` (``sparse_mode=3``: ``j <= i + Lk - Lq``; ``0``: all ``Lk``)

    score[t, j] = sum_h weights[t, h] * relu(query[t, h] . key[j])

and ``sparse_indices[t, 0, :]`` holds the **logical positions** (0..Lk-1 in the
request's KV sequence) of the ``sparse_count`` highest scores, highest first;
unused entries are **-1** (fewer visible keys than ``sparse_count``). No scaling
inside: any ``n_heads^-0.5 * softmax_scale`` factor is already in ``weights``.

Emulated: ``layout_query="TND"`` with cumulative int32 ``actual_seq_lengths_query``,
``layout_key="PA_BSND"`` (key [nb,bs,1,D]) with per-request int32
``actual_seq_lengths_key`` and an int32 ``block_table``; ``return_value`` raises.
Equal scores: the lower key position wins (and comes first). The documentation states no
tie rule and the op-plugin golden's unstable ``torch.sort`` leaves it open; the reference
fixes one so a request selects the same keys whatever the prefill chunking or its rows'
place in the batch (ReLU'd scores of exactly 0 tie often).
"""

from __future__ import annotations

import torch

from vllm_ascend_ext.ops._dispatch import torch_npu_module
from vllm_ascend_ext.ops.counting import npu_op
from vllm_ascend_ext.ops.op_record import NpuOp
from vllm_ascend_ext.ops.paged_read import gather_tokens, host_ints

OP = "npu_lightning_indexer"


def _check(query, key, weights, block_table, layout_query, layout_key, sparse_count,
           sparse_mode, return_value):
    if layout_query != "TND" or layout_key != "PA_BSND":
        raise NotImplementedError(
            f"{OP}: layouts {layout_query}/{layout_key} are not emulated (TND / PA_BSND)"
        )
    if return_value:
        raise NotImplementedError(f"{OP}: return_value (training, non-PA key) is not emulated")
    if sparse_mode not in (0, 3):
        raise ValueError(f"{OP}: sparse_mode must be 0 or 3, got {sparse_mode}")
    if not (1 <= sparse_count <= 2048 or (sparse_count % 1024 == 0 and sparse_count <= 8192)):
        raise ValueError(f"{OP}: sparse_count {sparse_count} not in [1, 2048] or 3072..8192")
    if query.dim() != 3 or key.dim() != 4 or key.shape[2] != 1 or key.shape[3] != query.shape[2]:
        raise ValueError(
            f"{OP}: query [T,N1,D] and key [nb,bs,1,D] required, got {tuple(query.shape)} / "
            f"{tuple(key.shape)}"
        )
    if tuple(weights.shape) != tuple(query.shape[:2]):
        raise ValueError(f"{OP}: weights must be {tuple(query.shape[:2])}, got {tuple(weights.shape)}")
    if block_table is None or block_table.dtype != torch.int32:
        raise ValueError(f"{OP}: an int32 block_table is required with PA_BSND keys")


def lightning_indexer_reference(query, key, weights, *, actual_seq_lengths_query=None,
                                actual_seq_lengths_key=None, block_table=None,
                                layout_query="BSND", layout_key="BSND", sparse_count=2048,
                                sparse_mode=3, pre_tokens=2**63 - 1, next_tokens=2**63 - 1,
                                return_value=False):
    _check(query, key, weights, block_table, layout_query, layout_key, sparse_count,
           sparse_mode, return_value)
    cu_q = host_ints(actual_seq_lengths_query, "actual_seq_lengths_query", OP)
    lens_k = host_ints(actual_seq_lengths_key, "actual_seq_lengths_key", OP)
    out = torch.full((query.shape[0], 1, sparse_count), -1, dtype=torch.int32,
                     device=query.device)
    start = 0
    for b, end in enumerate(cu_q):
        lq, lk = end - start, lens_k[b]
        if lq > 0 and lk > 0:
            kb = gather_tokens(key, block_table[b], lk).float()                 # [Lk, D]
            qk = torch.einsum("thd,kd->thk", query[start:end].float(), kb).relu()
            score = (qk * weights[start:end].float()[..., None]).sum(1)         # [Lq, Lk]
            if sparse_mode == 3:
                i = torch.arange(lq, device=query.device)[:, None]
                j = torch.arange(lk, device=query.device)[None]
                score = score.masked_fill(j > i + (lk - lq), float("-inf"))
            n = min(sparse_count, lk)
            # Equal scores: the lower key position first (a stable descending sort over
            # positions 0..Lk-1), so a row selects the same keys whatever its chunk or row.
            vals, idx = torch.sort(score, dim=-1, descending=True, stable=True)
            vals, idx = vals[:, :n], idx[:, :n]
            idx = idx.to(torch.int32).masked_fill(torch.isneginf(vals), -1)
            out[start:end, 0, :n] = idx
        start = end
    # The official meta's second output: the selected scores, empty unless return_value.
    return out, query.new_empty(0)


def lightning_indexer_meta(query, key, weights, *, actual_seq_lengths_query=None,
                           actual_seq_lengths_key=None, block_table=None, layout_query="BSND",
                           layout_key="BSND", sparse_count=2048, sparse_mode=3,
                           pre_tokens=2**63 - 1, next_tokens=2**63 - 1, return_value=False):
    _check(query, key, weights, block_table, layout_query, layout_key, sparse_count,
           sparse_mode, return_value)
    return (query.new_empty((query.shape[0], 1, sparse_count), dtype=torch.int32),
            query.new_empty(0))


def lightning_indexer_npu(query, key, weights, **kw):
    return torch_npu_module().npu_lightning_indexer(query, key, weights, **kw)


@npu_op(OP)
def npu_lightning_indexer(query, key, weights, *, actual_seq_lengths_query=None,
                          actual_seq_lengths_key=None, block_table=None, layout_query="BSND",
                          layout_key="BSND", sparse_count=2048, sparse_mode=3,
                          pre_tokens=2**63 - 1, next_tokens=2**63 - 1, return_value=False):
    impl = LIGHTNING_INDEXER.pick(query.device)
    return impl(query, key, weights, actual_seq_lengths_query=actual_seq_lengths_query,
                actual_seq_lengths_key=actual_seq_lengths_key, block_table=block_table,
                layout_query=layout_query, layout_key=layout_key, sparse_count=sparse_count,
                sparse_mode=sparse_mode, pre_tokens=pre_tokens, next_tokens=next_tokens,
                return_value=return_value)


LIGHTNING_INDEXER = NpuOp(OP, npu=lightning_indexer_npu, reference=lightning_indexer_reference,
                          meta=lightning_indexer_meta, rules="SFA_RULES")
