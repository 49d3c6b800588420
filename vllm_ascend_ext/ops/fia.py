"""``torch_npu.npu_fused_infer_attention_score`` (FIA): NPU call, reference, meta.

Every implementation takes ``(query, key, value, **kwargs)``; the keyword arguments and
their defaults are spelt once, ``fia_checks.FIAArgs``. The operator's record (``FIA``,
at the end) is what the entry dispatches through and what contract mode computes with.

Semantics: ``docs/npu-ops.md`` section 1 (TND layout, cumulative
``actual_seq_lengths``, per-request ``actual_seq_lengths_kv`` with a block table,
cumulative without; ``sparse_mode`` 0/2/3/4 with the 2048x2048 compressed mask
whose content is a per-tile template; GQA with contiguous head groups; fp32
accumulation, output cast to the query dtype; fully masked rows give 0).

The reference is vectorized over the batch: requests are bucketed by query length
(powers of two) and each bucket is one padded, masked attention. The Python loop
runs over buckets and row tiles, never over requests.

Emulation runs the compiled form of the reference, ``_C_ascend_ext.emu_fused_infer_attention_score``
(``csrc/emu_attention*``: reads the paged cache in place, parallel over requests, KV
heads and row tiles, online softmax in fp32) after the same checks; the reference below
runs where the library is missing or ``ASCEND_EXT_PY_REFERENCE=1`` (``ops/compiled.py``).
"""

from __future__ import annotations

import torch

from vllm_ascend_ext.ops._dispatch import torch_npu_module
from vllm_ascend_ext.ops.compiled import emulation_kernel
from vllm_ascend_ext.ops.fia_checks import FIA_KEYWORDS, FIAArgs, FIAPlan, PlanMemo
from vllm_ascend_ext.ops.op_record import NpuOp

OP = "npu_fused_infer_attention_score"
KERNEL = "emu_fused_infer_attention_score"
_FAR = 1 << 40  # pre/next tokens beyond any sequence: the kernel's int64 sums cannot overflow
# Upper bound on score elements materialized at once by the reference (fp32).
_SCORE_BUDGET = 1 << 24
# Padded score elements a merged bucket may add before two buckets stay separate
# (stands for the fixed cost of one more batched attention call).
_MERGE_SLACK = 1 << 16


def plan_buckets(q_lens: tuple[int, ...], kv_lens: tuple[int, ...]) -> list[list[int]]:
    """Group requests into padded attention calls (pure; host values only).

    Requests are bucketed by (query length, kv length) rounded up to powers of
    two; buckets adjacent in that order merge while the padded work of the merge
    stays within the separate works plus ``_MERGE_SLACK`` (few calls for short
    requests, no large padding for long ones).
    """
    by_pow: dict[tuple[int, int], list[int]] = {}
    for b, (lq, lkv) in enumerate(zip(q_lens, kv_lens)):
        if lq > 0:
            by_pow.setdefault(((lq - 1).bit_length(), max(lkv - 1, 0).bit_length()), []).append(b)

    def area(reqs: list[int]) -> int:
        return len(reqs) * max(q_lens[b] for b in reqs) * max(1, max(kv_lens[b] for b in reqs))

    groups: list[list[int]] = []
    for key in sorted(by_pow):
        reqs = by_pow[key]
        if groups and area(groups[-1] + reqs) <= area(groups[-1]) + area(reqs) + _MERGE_SLACK:
            groups[-1] = groups[-1] + reqs
        else:
            groups.append(list(reqs))
    return groups


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


def _token_rows(t: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    """A [rows, KV_N*D] view of a BnBsH paged cache over its storage, and the row
    stride of a block, when every token row is contiguous; else None."""
    if t.dim() != 3 or t.stride(2) != 1 or t.stride(1) != t.shape[2] or t.stride(0) % t.stride(1):
        return None
    per_block = t.stride(0) // t.stride(1)
    n_rows = (t.shape[0] - 1) * per_block + t.shape[1]
    return t.as_strided((n_rows, t.shape[2]), (t.stride(1), 1)), per_block


def _gather_kv(t: torch.Tensor, plan: FIAPlan, reqs: list[int], reqs_t: torch.Tensor,
               kv_pad: int, block_table) -> torch.Tensor:
    """K or V of each request of a bucket: [g, KV_N, S, D] fp32, S >= kv_pad.

    Paged caches are never reshaped (the plugin's cache views are strided across
    blocks: a reshape would copy the whole cache). Token rows are gathered with
    ``index_select`` (several times faster than advanced indexing).
    """
    g, kvh = reqs_t.shape[0], plan.num_kv_heads
    if plan.paged:
        bs = plan.block_size
        rows = _token_rows(t)
        if rows is not None:  # BnBsH: exactly kv_pad token rows per request
            flat, per_block = rows
            j = torch.arange(kv_pad, device=t.device)
            blk = block_table[reqs_t][:, (j // bs).clamp(max=block_table.shape[1] - 1)]
            idx = (blk.long() * per_block + j % bs).reshape(-1)
            x = torch.index_select(flat, 0, idx).float()
            return x.view(g, kv_pad, kvh, -1).transpose(1, 2)
        nblk = -(-kv_pad // bs)  # otherwise whole blocks
        x = torch.index_select(t, 0, block_table[reqs_t, :nblk].reshape(-1)).float()
        if t.dim() == 4:  # BnNBsD: [g*nblk, KV_N, bs, D]
            x = x.view(g, nblk, kvh, bs, -1).permute(0, 2, 1, 3, 4)
            return x.reshape(g, kvh, nblk * bs, -1)
        return x.view(g, nblk * bs, kvh, -1).transpose(1, 2)
    starts = torch.tensor([plan.cu_kv[b] for b in reqs], device=t.device)
    rows = (starts[:, None] + torch.arange(kv_pad, device=t.device)).clamp(
        max=max(plan.cu_kv[-1] - 1, 0))
    return t[rows].float().transpose(1, 2)


def _attend(q, k, v, vis, scale, need_lse):
    """q [g,Nq,r,D], k/v [g,KV_N,S,D], vis [g,r,S] -> (out [g,Nq,r,Dv], lse [g,Nq,r]|None).

    Without LSE: PyTorch's fused SDPA. With LSE: explicit fp32 softmax. Rows that
    see no key give 0 (and LSE -inf) either way.
    """
    seen = vis.any(-1)  # [g, r]
    if not need_lse:
        mask = (vis | ~seen[..., None])[:, None]  # blank rows attend anywhere, zeroed below
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=scale, enable_gqa=k.shape[1] != q.shape[1])
        return out.masked_fill(~seen[:, None, :, None], 0.0), None
    g, nq, r, d = q.shape
    kvh = k.shape[1]
    qg = q.view(g, kvh, nq // kvh, r, d)
    s = (qg @ k.transpose(-1, -2)[:, :, None]) * scale  # [g, kvh, G, r, S]
    s = s.masked_fill(~vis[:, None, None], float("-inf"))
    m = s.amax(-1, keepdim=True).clamp_min(-1e30)
    e = torch.exp(s - m)
    z = e.sum(-1, keepdim=True)
    out = (e / z.clamp_min(1e-30)) @ v[:, :, None]  # [g, kvh, G, r, Dv]
    lse = (m + z.log()).view(g, nq, r)
    return out.view(g, nq, r, -1), lse


def fia_reference(query, key, value, **kwargs):
    a = FIAArgs.of(kwargs)
    plan = _check(query, key, value, a)
    device = query.device
    T, N = plan.num_tokens, plan.num_heads
    out = torch.zeros(T, N, plan.value_head_size, dtype=torch.float32, device=device)
    lse = torch.full((T, N, 1), float("-inf"), dtype=torch.float32, device=device)
    mask2d = _mask2d(a)
    groups = plan_buckets(plan.q_lens, plan.kv_lens) if key.shape[0] else []
    for reqs in groups:  # a handful of padded calls per step, never one per request
        g = len(reqs)
        reqs_t = torch.tensor(reqs, device=device)
        q_pad = max(plan.q_lens[b] for b in reqs)
        kv_pad = max(max(plan.kv_lens[b] for b in reqs), 1)
        k = _gather_kv(key, plan, reqs, reqs_t, kv_pad, a.block_table)  # [g, kvh, S, D]
        v = _gather_kv(value, plan, reqs, reqs_t, kv_pad, a.block_table)
        q_len = torch.tensor([plan.q_lens[b] for b in reqs], device=device)[:, None, None]
        kv_len = torch.tensor([plan.kv_lens[b] for b in reqs], device=device)[:, None, None]
        q_start = torch.tensor([plan.cu_q[b] for b in reqs], device=device)[:, None]
        j = torch.arange(k.shape[2], device=device)[None, None, :]
        tile = max(1, min(q_pad, _SCORE_BUDGET // max(1, g * N * k.shape[2])))
        for r0 in range(0, q_pad, tile):
            r = torch.arange(r0, min(q_pad, r0 + tile), device=device)
            tok = (q_start + r).clamp(max=T - 1)  # [g, rows]
            q = query[tok].float().permute(0, 2, 1, 3)  # [g, N, rows, D]
            vis = _visible(r[None, :, None], j, q_len, kv_len, a.sparse_mode, mask2d,
                           a.pre_tokens, a.next_tokens)
            o, row_lse = _attend(q, k, v, vis, a.scale, a.softmax_lse_flag)
            valid = (r[None, :] < q_len[:, :, 0]).reshape(-1)
            flat_tok = tok.reshape(-1)[valid]
            out[flat_tok] = o.permute(0, 2, 1, 3).reshape(-1, N, plan.value_head_size)[valid]
            if row_lse is not None:
                lse[flat_tok] = row_lse.permute(0, 2, 1).reshape(-1, N, 1)[valid]
    attn = out.to(query.dtype)
    if a.softmax_lse_flag:
        return attn, lse
    return attn, torch.zeros(0, dtype=torch.float32, device=device)  # as torch_npu's meta


def fia_emulated(query, key, value, **kwargs):
    """The emulation's FIA: the compiled kernel after the reference's checks, or the
    reference itself (same arguments, same results)."""
    kernel = emulation_kernel(KERNEL, query.device)
    if kernel is None or key.shape[0] == 0 or key.stride(-1) != 1 or value.stride(-1) != 1:
        return fia_reference(query, key, value, **kwargs)
    a = FIAArgs.of(kwargs)
    plan = _check(query, key, value, a)
    return kernel(
        query, key, value, a.block_table if plan.paged else None, plan.cu_q,
        plan.kv_lens, plan.cu_kv, _mask2d(a),
        num_kv_heads=plan.num_kv_heads, sparse_mode=a.sparse_mode,
        pre_tokens=min(a.pre_tokens, _FAR), next_tokens=min(a.next_tokens, _FAR),
        scale=float(a.scale), block_size=plan.block_size,
        softmax_lse_flag=a.softmax_lse_flag)


def fia_meta(query, key, value, **kwargs):
    a = FIAArgs.of(kwargs)
    plan = _check(query, key, value, a)
    out = query.new_empty(plan.num_tokens, plan.num_heads, plan.value_head_size)
    if a.softmax_lse_flag:
        lse = query.new_empty(plan.num_tokens, plan.num_heads, 1, dtype=torch.float32)
    else:  # torch_npu's meta: an empty LSE when it is not asked for
        lse = query.new_empty(0, dtype=torch.float32)
    return out, lse


def fia_npu(query, key, value, **kwargs):
    """torch_npu's operator, with every keyword argument of ``FIAArgs`` passed (the
    plugin's defaults, which are torch_npu's) and the given optionals."""
    return torch_npu_module().npu_fused_infer_attention_score(
        query, key, value, **{**FIA_KEYWORDS, **kwargs})


def _mask2d(a: FIAArgs) -> torch.Tensor | None:
    """Mode 0's explicit mask as one [S_q, S_kv] plane (None in the compressed modes)."""
    if a.sparse_mode == 0 and a.atten_mask is not None:
        return a.atten_mask.reshape(-1, *a.atten_mask.shape[-2:])[0]
    return None


def _check(query, key, value, a: FIAArgs) -> FIAPlan:
    return _PLANS.check(
        query, key, value, atten_mask=a.atten_mask, actual_seq_lengths=a.actual_seq_lengths,
        actual_seq_lengths_kv=a.actual_seq_lengths_kv, block_table=a.block_table,
        num_heads=a.num_heads, input_layout=a.input_layout,
        num_key_value_heads=a.num_key_value_heads, sparse_mode=a.sparse_mode,
        block_size=a.block_size, unsupported=a.optionals,
    )


# The layers of a step share their host tuples: their checks run once per step.
_PLANS = PlanMemo()


def npu_fused_infer_attention_score(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """torch_npu's operator: the same positional tensors, keyword arguments and semantics
    (``FIAArgs``: the keywords and their defaults, and the optionals not emulated)."""
    return FIA.pick(query.device)(query, key, value, **kwargs)


def npu_fused_infer_attention_score_out(query, key, value, *, workspace, out, **kwargs):
    """The emulation of the ``.out`` overload graph tasks issue on the CPU stand-in
    (``attention/fia/graph_tasks.py``; on an NPU they call torch_npu's own): the functional
    operator above (checked by the contract harness in contract mode) written into
    ``out = [attention, lse]``."""
    attn, lse = npu_fused_infer_attention_score(query, key, value, **kwargs)
    out[0].copy_(attn)
    if kwargs.get("softmax_lse_flag"):
        out[1].copy_(lse)
    return out


def fia_max_workspace(query, key, value, **kwargs) -> torch.Tensor:
    """The emulation of ``_npu_fused_infer_attention_score_get_max_workspace`` (graph tasks
    on the CPU stand-in): the references need no workspace (an empty tensor)."""
    return query.new_empty(0, dtype=torch.uint8)


def causal_mask_2048(device: torch.device | str = "cpu") -> torch.Tensor:
    """The canonical compressed causal mask (1 = masked) that sparse_mode 2/3/4 take."""
    return torch.triu(torch.ones(2048, 2048, dtype=torch.int8, device=device), diagonal=1)


FIA = NpuOp(OP, npu=fia_npu, reference=fia_reference, meta=fia_meta, emulation=fia_emulated,
            kernel=KERNEL, rules="FIA_RULES", counted_once=False)
