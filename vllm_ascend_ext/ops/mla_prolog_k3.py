"""``_C_ascend_ext.npu_mla_prolog_v3_k3``: the MLA prolog for layers without RoPE dims.

The plugin's own op (compiled in ``csrc/``, namespace ``_C_ascend_ext``; never CANN's
``npu_mla_prolog_v3`` name). Schema: ``npu_mla_prolog_v3`` without the RoPE inputs
(``rope_sin``, ``rope_cos``, ``kr_cache``) and outputs; returns ``(query, query_norm)``
(``query_norm`` None unless ``query_norm_flag``). Semantics (``docs/npu-ops.md`` §2,
non-quantized, with ``qk_rope_head_dim == 0``):

    c^Q   = RmsNorm(x @ W_dq, gamma_cq) * qc_qr_scale      (rounded to weight_uk's dtype)
    q     = c^Q @ W_uq_qr -> [T, N, D]                    D (nope) in {96, 128}
    query = q @ W_uk[n]                                    [T, N, Hckv]
    c^KV  = RmsNorm(x @ W_dkv_kr, gamma_ckv) * kc_scale   -> kv_cache

Rounding points (the owners' CPU golden, as ``npu_mla_prolog_v3``): ``x @ W_dq`` is
rounded to ``token_x``'s dtype (when bf16/fp16) before its RmsNorm, which runs in fp32;
c^Q and q to ``weight_uk``'s dtype before the next matmul.

Cache modes: ``PA_BSND`` (kv_cache [nb, bs, 1, Hckv], ``cache_index`` int64 [T] global
slots) and ``BSND`` (token_x [B, S, He], kv_cache [B, S_cache, 1, Hckv], ``cache_index``
int64 [B, S] positions in each batch row, default 0..S-1). Negative indices are not
written; caches may be strided views. bf16 and fp32.

Dispatch: the compiled library when it is loaded (its CPU, Meta and, in a CANN build,
NPU kernels); otherwise the Python reference / meta implementation below.
"""

from __future__ import annotations

import torch

from vllm_ascend_ext.ops import _ext
from vllm_ascend_ext.ops.counting import npu_op
from vllm_ascend_ext.ops.norm import rms_fp32
from vllm_ascend_ext.ops.op_record import NpuOp
from vllm_ascend_ext.ops.paged_write import write_rows

OP = "npu_mla_prolog_v3_k3"
NOPE_DIMS = (96, 128)


def _check(x, w_dq, w_uq, w_uk, w_dkv, g_cq, g_ckv, kv_cache, cache_index, cache_mode):
    if cache_mode not in ("PA_BSND", "BSND"):
        raise ValueError(f"{OP}: cache_mode must be PA_BSND or BSND, got {cache_mode!r}")
    if w_uk.dim() != 3:
        raise ValueError(f"{OP}: weight_uk must be [N, D, Hckv], got {tuple(w_uk.shape)}")
    n, d, hckv = w_uk.shape
    he, hcq = x.shape[-1], g_cq.shape[-1]
    if d not in NOPE_DIMS:
        raise ValueError(f"{OP}: nope head dim must be 96 or 128, got {d}")
    for name, t, shape in (("weight_dq", w_dq, (he, hcq)), ("weight_uq_qr", w_uq, (hcq, n * d)),
                           ("weight_dkv_kr", w_dkv, (he, hckv)),
                           ("rmsnorm_gamma_ckv", g_ckv, (hckv,))):
        if tuple(t.shape) != shape:
            raise ValueError(f"{OP}: {name} must be {shape} ([in, out], no rope part), got "
                             f"{tuple(t.shape)}")
    for t in (x, w_dq, w_uq, w_uk, w_dkv):
        if t.dtype not in (torch.bfloat16, torch.float32):
            raise ValueError(f"{OP}: inputs must be bf16 or fp32, got {t.dtype}")
    if kv_cache.dim() != 4 or kv_cache.shape[2] != 1 or kv_cache.shape[3] != hckv:
        raise ValueError(f"{OP}: kv_cache must be [*, *, 1, {hckv}], got {tuple(kv_cache.shape)}")
    tokens = x.numel() // he
    if cache_mode == "PA_BSND" and cache_index is None:
        raise ValueError(f"{OP}: cache_index (int64 slots) is required with PA_BSND")
    if cache_mode == "BSND" and (x.dim() != 3 or kv_cache.shape[0] != x.shape[0]):
        raise ValueError(f"{OP}: BSND needs token_x [B, S, He] and kv_cache [B, S_cache, 1, Hckv]")
    if cache_index is not None:
        if cache_index.dtype != torch.int64:
            raise ValueError(f"{OP}: cache_index must be int64, got {cache_index.dtype}")
        if cache_index.numel() != tokens:
            raise ValueError(f"{OP}: {tokens} tokens but {cache_index.numel()} cache indices")
    return tokens, n, d, hckv, hcq


def _write(kv_cache, rows, cache_index, cache_mode, x):
    if cache_mode == "PA_BSND":
        write_rows(kv_cache, cache_index, rows)
    else:
        b, s = x.shape[0], x.shape[1]
        pos = (cache_index.reshape(b, s) if cache_index is not None
               else torch.arange(s, device=x.device).expand(b, s))
        batch = torch.arange(b, device=x.device)[:, None].expand(b, s)
        keep = pos >= 0
        kv_cache[batch[keep], pos[keep], 0] = rows.reshape(b, s, -1)[keep].to(kv_cache.dtype)


def mla_prolog_v3_k3_reference(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr,
                               rmsnorm_gamma_cq, rmsnorm_gamma_ckv, kv_cache, *, cache_index=None,
                               rmsnorm_epsilon_cq=1e-5, rmsnorm_epsilon_ckv=1e-5,
                               cache_mode="PA_BSND", query_norm_flag=False, qc_qr_scale=1.0,
                               kc_scale=1.0):
    t, n, d, _, _ = _check(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr,
                           rmsnorm_gamma_cq, rmsnorm_gamma_ckv, kv_cache, cache_index, cache_mode)
    mid = weight_uk.dtype
    x = token_x.reshape(t, -1).float()
    cq_pre = x @ weight_dq.float()
    if token_x.dtype in (torch.bfloat16, torch.float16):  # the owners' golden rounds x @ W_dq
        cq_pre = cq_pre.to(token_x.dtype).float()
    cq = (rms_fp32(cq_pre, rmsnorm_gamma_cq, rmsnorm_epsilon_cq) * qc_qr_scale).to(mid)
    q = (cq.float() @ weight_uq_qr.float()).view(t, n, d).to(mid).float()
    query = torch.bmm(q.transpose(0, 1), weight_uk.float()).transpose(0, 1)
    ckv = rms_fp32(x @ weight_dkv_kr.float(), rmsnorm_gamma_ckv, rmsnorm_epsilon_ckv) * kc_scale
    _write(kv_cache, ckv, cache_index, cache_mode, token_x)
    return query.to(mid).contiguous(), (cq if query_norm_flag else None)


def mla_prolog_v3_k3_meta(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr,
                          rmsnorm_gamma_cq, rmsnorm_gamma_ckv, kv_cache, *, cache_index=None,
                          rmsnorm_epsilon_cq=1e-5, rmsnorm_epsilon_ckv=1e-5,
                          cache_mode="PA_BSND", query_norm_flag=False, qc_qr_scale=1.0,
                          kc_scale=1.0):
    t, n, _, hckv, hcq = _check(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr,
                                rmsnorm_gamma_cq, rmsnorm_gamma_ckv, kv_cache, cache_index,
                                cache_mode)
    new = token_x.new_empty
    return (new((t, n, hckv), dtype=weight_uk.dtype),
            new((t, hcq), dtype=weight_uk.dtype) if query_norm_flag else None)


def _no_npu_kernel(*args, **kwargs):
    raise RuntimeError(
        f"{OP}: the compiled op library _C_ascend_ext is not installed, and this op has no "
        "torch_npu counterpart; rebuild the plugin on the NPU host (docs/operators.md: the op library)")


@npu_op(f"{_ext.NAMESPACE}.{OP}")
def npu_mla_prolog_v3_k3(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr,
                         rmsnorm_gamma_cq, rmsnorm_gamma_ckv, kv_cache, *, cache_index=None,
                         rmsnorm_epsilon_cq: float = 1e-5, rmsnorm_epsilon_ckv: float = 1e-5,
                         cache_mode: str = "PA_BSND", query_norm_flag: bool = False,
                         qc_qr_scale: float = 1.0, kc_scale: float = 1.0):
    kw = dict(cache_index=cache_index, rmsnorm_epsilon_cq=rmsnorm_epsilon_cq,
              rmsnorm_epsilon_ckv=rmsnorm_epsilon_ckv, cache_mode=cache_mode,
              query_norm_flag=query_norm_flag, qc_qr_scale=qc_qr_scale, kc_scale=kc_scale)
    args = (token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq,
            rmsnorm_gamma_ckv, kv_cache)
    if _ext.load():
        query, query_norm = getattr(torch.ops, _ext.NAMESPACE).npu_mla_prolog_v3_k3(*args, **kw)
        return query, (query_norm if query_norm_flag else None)
    impl = MLA_PROLOG_V3_K3.pick(token_x.device)
    return impl(*args, **kw)


MLA_PROLOG_V3_K3 = NpuOp(OP, npu=_no_npu_kernel, reference=mla_prolog_v3_k3_reference,
                         meta=mla_prolog_v3_k3_meta, kernel=OP, torch_npu=False)
