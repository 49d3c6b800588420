"""``torch_npu.npu_mla_prolog_v3``: the fused MLA preprocessing (query and latent-KV paths).

Semantics (``docs/npu-ops.md`` §2; structure from ``test_mla_prolog_v3.py::baseline``):

    c^Q   = RmsNorm(x @ W_dq, gamma_cq) * qc_qr_scale                [T, Hcq]
    q     = c^Q @ W_uq_qr  -> per head [q_nope (D) | q_pe (Dr)]     [T, N, D+Dr]
    query = q_nope @ W_uk[n]                                         [T, N, Hckv]
    query_rope = RoPE(q_pe)            (interleaved in, half-split out; §0.7)
    kvkr  = x @ W_dkv_kr -> c^KV = RmsNorm(kvkr[:, :Hckv], gamma_ckv) * kc_scale,
            k_r = RoPE(kvkr[:, Hckv:])
    kv_cache[cache_index[t]] = c^KV[t]; kr_cache[cache_index[t]] = k_r[t]   (int64 slots,
            negative -> not written)

Returns ``(query, query_rope, dequant_scale_q_nope, query_norm, dequant_scale_q_norm)``;
``query_norm`` is c^Q when ``query_norm_flag`` (the DeepSeek-V3.2 indexer's q input).
Outputs a mode does not produce are empty tensors (shape ``(0,)``), as the official
meta returns them with CANN >= 8.5.0.alpha003: float32 scales, ``query_norm`` in
``weight_uq_qr``'s dtype.

Weights are ``[in, out]`` (a Linear weight transposed); ``weight_uk`` is [N, D, Hckv].

Rounding points (unquantized): the kernel rounds ``x @ W_dq`` before its RmsNorm, c^Q
and q_nope before the next matmul, and the rope half q_pe before RoPE, to bf16 (from
op-plugin's CPU golden); the reference rounds the same four to ``weight_uk``'s dtype,
which is bf16 on the NPU and fp32 in fp32 emulation (documented relaxation, docs/operators.md).

``weight_quant_mode=2`` (W8A8 dynamic): ``token_x`` is int8 with per-token
``dequant_scale_x`` [T,1]; ``weight_dq``/``weight_uq_qr``/``weight_dkv_kr`` are int8
with per-channel ``dequant_scale_w_*`` [1,out]; matmuls accumulate in int32 and are
scaled by both; c^Q is dynamically re-quantized per token (optional
``smooth_scales_cq``) before ``W_uq_qr``, and ``query_norm`` is then that int8 c^Q
with ``dequant_scale_q_norm`` [T,1] [I: the doc lists the scale for quantized modes].
``query_quant_mode=1`` returns an int8 query with ``dequant_scale_q_nope`` [T,N,1].

Emulated: ``cache_mode="PA_BSND"``, ``weight_quant_mode`` 0/2, ``kv_cache_quant_mode``
0, ``query_quant_mode`` 0/1; anything else raises NotImplementedError.
"""

from __future__ import annotations

import torch

from vllm_ascend_ext.ops._dispatch import torch_npu_module
from vllm_ascend_ext.ops.counting import npu_op
from vllm_ascend_ext.ops.norm import rms_fp32
from vllm_ascend_ext.ops.op_record import NpuOp
from vllm_ascend_ext.ops.paged_write import check_paged_cache, check_slots, write_rows
from vllm_ascend_ext.ops.quant import dynamic_quant_reference, quant_matmul_reference
from vllm_ascend_ext.ops.rope import rope_interleave_half

OP = "npu_mla_prolog_v3"
EMULATED_WEIGHT_QUANT_MODES = (0, 2)


def _check(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, gamma_cq, gamma_ckv,
           rope_sin, rope_cos, kv_cache, kr_cache, cache_index, dequant_scale_x,
           dequant_scale_w_dq, dequant_scale_w_uq_qr, dequant_scale_w_dkv_kr, cache_mode,
           weight_quant_mode, kv_cache_quant_mode, query_quant_mode):
    if cache_mode != "PA_BSND":
        raise NotImplementedError(f"{OP}: cache_mode {cache_mode!r} is not emulated (PA_BSND)")
    if weight_quant_mode not in EMULATED_WEIGHT_QUANT_MODES:
        raise NotImplementedError(
            f"{OP}: weight_quant_mode {weight_quant_mode} is not emulated (0 none, 2 W8A8)"
        )
    if kv_cache_quant_mode != 0:
        raise NotImplementedError(f"{OP}: kv_cache_quant_mode {kv_cache_quant_mode} not emulated")
    if query_quant_mode not in (0, 1):
        raise NotImplementedError(f"{OP}: query_quant_mode {query_quant_mode} not emulated")
    if weight_uk.dim() != 3:
        raise ValueError(f"{OP}: weight_uk must be [N, D, Hckv], got {tuple(weight_uk.shape)}")
    n, d, hckv = weight_uk.shape
    he = token_x.shape[-1]
    hcq = gamma_cq.shape[-1]
    dr = rope_cos.shape[-1]
    expect = {
        "weight_dq": (weight_dq, (he, hcq)),
        "weight_uq_qr": (weight_uq_qr, (hcq, n * (d + dr))),
        "weight_dkv_kr": (weight_dkv_kr, (he, hckv + dr)),
        "rmsnorm_gamma_ckv": (gamma_ckv, (hckv,)),
    }
    for name, (t, shape) in expect.items():
        if tuple(t.shape) != shape:
            raise ValueError(f"{OP}: {name} must be {shape} ([in, out]), got {tuple(t.shape)}")
    tokens = token_x.numel() // he
    for name, t in (("rope_sin", rope_sin), ("rope_cos", rope_cos)):
        if t.numel() != tokens * dr:
            raise ValueError(f"{OP}: {name} must be [T, {dr}] with T={tokens}, got {tuple(t.shape)}")
    if cache_index is None:
        raise ValueError(f"{OP}: cache_index (int64 slots) is required with PA_BSND")
    check_slots(OP, cache_index, tokens)
    check_paged_cache(OP, "kv_cache", kv_cache, hckv)
    check_paged_cache(OP, "kr_cache", kr_cache, dr)
    if weight_quant_mode == 2:
        if token_x.dtype != torch.int8 or weight_dq.dtype != torch.int8 \
                or weight_uq_qr.dtype != torch.int8 or weight_dkv_kr.dtype != torch.int8:
            raise ValueError(f"{OP}: weight_quant_mode=2 needs int8 token_x, weight_dq, "
                             "weight_uq_qr and weight_dkv_kr")
        for name, t in (("dequant_scale_x", dequant_scale_x),
                        ("dequant_scale_w_dq", dequant_scale_w_dq),
                        ("dequant_scale_w_uq_qr", dequant_scale_w_uq_qr),
                        ("dequant_scale_w_dkv_kr", dequant_scale_w_dkv_kr)):
            if t is None:
                raise ValueError(f"{OP}: weight_quant_mode=2 needs {name}")
    elif token_x.dtype == torch.int8:
        raise ValueError(f"{OP}: int8 token_x needs weight_quant_mode=2")
    return tokens, n, d, hckv, hcq, dr


def mla_prolog_v3_reference(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr,
                            rmsnorm_gamma_cq, rmsnorm_gamma_ckv, rope_sin, rope_cos, kv_cache,
                            kr_cache, *, cache_index=None, dequant_scale_x=None,
                            dequant_scale_w_dq=None, dequant_scale_w_uq_qr=None,
                            dequant_scale_w_dkv_kr=None, quant_scale_ckv=None,
                            quant_scale_ckr=None, smooth_scales_cq=None, actual_seq_len=None,
                            k_nope_clip_alpha=None, rmsnorm_epsilon_cq=1e-5,
                            rmsnorm_epsilon_ckv=1e-5, cache_mode="PA_BSND",
                            query_norm_flag=False, weight_quant_mode=0, kv_cache_quant_mode=0,
                            query_quant_mode=0, ckvkr_repo_mode=0, quant_scale_repo_mode=0,
                            tile_size=128, qc_qr_scale=1.0, kc_scale=1.0):
    t, n, d, hckv, _, dr = _check(
        token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq,
        rmsnorm_gamma_ckv, rope_sin, rope_cos, kv_cache, kr_cache, cache_index, dequant_scale_x,
        dequant_scale_w_dq, dequant_scale_w_uq_qr, dequant_scale_w_dkv_kr, cache_mode,
        weight_quant_mode, kv_cache_quant_mode, query_quant_mode)
    mid = weight_uk.dtype
    x = token_x.reshape(t, -1)
    cos = rope_cos.reshape(t, dr)
    sin = rope_sin.reshape(t, dr)
    q_norm_scale = None
    if weight_quant_mode == 2:
        sx = dequant_scale_x.reshape(t, 1)
        cq_pre = quant_matmul_reference(x, weight_dq, dequant_scale_w_dq, pertoken_scale=sx,
                                        output_dtype=torch.float32)
        cq = rms_fp32(cq_pre, rmsnorm_gamma_cq, rmsnorm_epsilon_cq) * qc_qr_scale
        cq_q, s_cq = dynamic_quant_reference(cq, smooth_scales=smooth_scales_cq)
        qcqr = quant_matmul_reference(cq_q, weight_uq_qr, dequant_scale_w_uq_qr,
                                      pertoken_scale=s_cq, output_dtype=torch.float32)
        kvkr = quant_matmul_reference(x, weight_dkv_kr, dequant_scale_w_dkv_kr,
                                      pertoken_scale=sx, output_dtype=torch.float32)
        q_norm, q_norm_scale = cq_q, s_cq.reshape(t, 1)
    else:
        cq_pre = (x.float() @ weight_dq.float()).to(mid).float()
        cq = rms_fp32(cq_pre, rmsnorm_gamma_cq, rmsnorm_epsilon_cq)
        cq = (cq * qc_qr_scale).to(mid)
        qcqr = cq.float() @ weight_uq_qr.float()
        kvkr = x.float() @ weight_dkv_kr.float()
        q_norm = cq
    qcqr = qcqr.view(t, n, d + dr)
    q_nope = qcqr[..., :d].to(mid).float()
    query = torch.einsum("tnd,ndc->tnc", q_nope, weight_uk.float()).contiguous()
    q_pe = qcqr[..., d:] if weight_quant_mode == 2 else qcqr[..., d:].to(mid).float()
    query_rope = rope_interleave_half(q_pe, cos[:, None], sin[:, None])
    ckv = rms_fp32(kvkr[:, :hckv], rmsnorm_gamma_ckv, rmsnorm_epsilon_ckv) * kc_scale
    kr = rope_interleave_half(kvkr[:, hckv:], cos, sin)
    write_rows(kv_cache, cache_index, ckv)
    write_rows(kr_cache, cache_index, kr)
    q_scale = _absent(token_x)
    if query_quant_mode == 1:
        q_scale = query.abs().amax(-1, keepdim=True) / 127.0
        query = torch.round(query / q_scale.clamp_min(torch.finfo(torch.float32).tiny))
        query = query.clamp(-128, 127).to(torch.int8)
    else:
        query = query.to(mid)
    if not query_norm_flag:
        q_norm, q_norm_scale = _absent(token_x, weight_uq_qr.dtype), None
    return (query, query_rope.to(mid), q_scale, q_norm,
            q_norm_scale if query_norm_flag and q_norm_scale is not None else _absent(token_x))


def _absent(like: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An output the mode does not produce: empty, as the official meta gives it."""
    return like.new_empty(0, dtype=dtype)


def mla_prolog_v3_meta(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr,
                       rmsnorm_gamma_cq, rmsnorm_gamma_ckv, rope_sin, rope_cos, kv_cache,
                       kr_cache, *, cache_index=None, dequant_scale_x=None,
                       dequant_scale_w_dq=None, dequant_scale_w_uq_qr=None,
                       dequant_scale_w_dkv_kr=None, query_norm_flag=False, cache_mode="PA_BSND",
                       weight_quant_mode=0, kv_cache_quant_mode=0, query_quant_mode=0, **_):
    t, n, _, hckv, hcq, dr = _check(
        token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq,
        rmsnorm_gamma_ckv, rope_sin, rope_cos, kv_cache, kr_cache, cache_index, dequant_scale_x,
        dequant_scale_w_dq, dequant_scale_w_uq_qr, dequant_scale_w_dkv_kr, cache_mode,
        weight_quant_mode, kv_cache_quant_mode, query_quant_mode)
    mid = weight_uk.dtype
    new = token_x.new_empty
    query = new((t, n, hckv), dtype=torch.int8 if query_quant_mode == 1 else mid)
    q_scale = new((t, n, 1), dtype=torch.float32) if query_quant_mode == 1 else _absent(token_x)
    q_norm, q_norm_scale = _absent(token_x, weight_uq_qr.dtype), _absent(token_x)
    if query_norm_flag:
        q_norm = new((t, hcq), dtype=torch.int8 if weight_quant_mode == 2 else mid)
        if weight_quant_mode == 2:
            q_norm_scale = new((t, 1), dtype=torch.float32)
    return query, new((t, n, dr), dtype=mid), q_scale, q_norm, q_norm_scale


def mla_prolog_v3_npu(*args, **kw):
    return torch_npu_module().npu_mla_prolog_v3(*args, **kw)


@npu_op(OP)
def npu_mla_prolog_v3(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr,
                      rmsnorm_gamma_cq, rmsnorm_gamma_ckv, rope_sin, rope_cos, kv_cache, kr_cache,
                      **kwargs):
    """Same positional tensors and keywords as ``torch_npu.npu_mla_prolog_v3``."""
    impl = MLA_PROLOG_V3.pick(token_x.device)
    return impl(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq,
                rmsnorm_gamma_ckv, rope_sin, rope_cos, kv_cache, kr_cache, **kwargs)


MLA_PROLOG_V3 = NpuOp(OP, npu=mla_prolog_v3_npu, reference=mla_prolog_v3_reference,
                      meta=mla_prolog_v3_meta, rules="SFA_RULES")
