"""The layer ops' NPU operators (``layers/``) and the W8A8 fused experts, against their
references on the same inputs.

Same contract as ``npu_parity.py`` (whose ``Measured``, ``_npu`` and ``_err`` these cases
use, and whose ``SMOKE`` lists them): inputs built on the CPU as the engine passes them
(bf16; RoPE's query and key as strided column slices of one fused QKV tensor; the
Gemma-with-residual gamma ``w + 1`` formed in the weight's dtype; the expert weight cast
to FRACTAL_NZ), the reference run there and the ``*_npu`` call site on ``_npu(...)``
copies. ``npu_parity`` is imported when a case runs, not with this module: it lists these
cases in ``SMOKE``, and the dry run's identity ``_npu`` (patched on ``npu_parity``) must
reach them too.

Bounds: bf16 outputs within 1e-2 of their scale (the largest magnitude), rounded copies
(the new residual) within one bf16 step at that scale; fp32 statistics (rstd, quant
scales) by relative error; int8 outputs at most one step off, on at most 10% of the
elements. That fraction is what one extra bf16 rounding inside a kernel costs, with
margin: on these inputs, rounding the normalised value to bf16 before the quant flips
5.2% of ``npu_add_rms_norm_dynamic_quant``'s int8 (scale 3.5e-3 rel), taking rstd from
the rounded ``x_out`` 4.7%; rounding the fused GEMM's dequantized ``h`` to bf16 2.8% of
``npu_grouped_matmul_swiglu_quant``'s (scale 6.9e-3 rel), its SwiGLU output 1.9%; all
one step at most. A wrong scale, half or group moves many steps.
"""

from __future__ import annotations

import torch

from vllm_ascend_ext.ops.add_rms_norm import add_rms_norm_npu, add_rms_norm_reference
from vllm_ascend_ext.ops.add_rms_norm_quant import (
    add_rms_norm_dynamic_quant_npu,
    add_rms_norm_dynamic_quant_reference,
)
from vllm_ascend_ext.ops.dequant_swiglu_quant import (
    dequant_swiglu_quant_npu,
    dequant_swiglu_quant_reference,
)
from vllm_ascend_ext.ops.format import ACL_FORMAT_FRACTAL_NZ, format_cast_npu
from vllm_ascend_ext.ops.grouped_matmul_swiglu_quant import (
    grouped_matmul_swiglu_quant_npu,
    grouped_matmul_swiglu_quant_reference,
)
from vllm_ascend_ext.ops.moe_dispatch import init_routing_v2_npu, init_routing_v2_reference
from vllm_ascend_ext.ops.mrope import mrope_npu, mrope_reference
from vllm_ascend_ext.ops.norm import (
    gemma_rms_norm_npu,
    gemma_rms_norm_reference,
    rms_norm_npu,
    rms_norm_reference,
)
from vllm_ascend_ext.ops.quant import (
    dynamic_quant_reference,
    quant_matmul_npu,
    quant_matmul_reference,
)

BF = torch.bfloat16
BF16_STEP = 2.0**-7          # one bf16 step relative to the binade's top (8 significand bits)
INT8_DIFFERING = 0.1         # int8 outputs: at most this fraction one step off (docstring)


def _base():
    from vllm_ascend_ext.tools import npu_parity

    return npu_parity


def _npu(t):
    return _base()._npu(t)


def _m(what, value, bound, at_least=False):
    return _base().Measured(what, value, bound, at_least)


def _err(got, ref) -> float:
    return _base()._err(got, ref)


def _scale(t) -> float:
    return t.float().abs().max().item()


def _rel_err(got, ref) -> float:
    """Largest relative error of a positive fp32 statistic (rstd, a quant scale)."""
    ref = ref.float()
    return ((got.cpu().float() - ref).abs() / ref.abs().clamp_min(1e-30)).max().item()


def _bf16(what, got, ref) -> list:
    return [_m(f"{what} max abs err", _err(got, ref), 1e-2 * _scale(ref))]


def _rounded(what, got, ref) -> list:
    """A value the op only rounds (the new residual): one bf16 step at most."""
    return [_m(f"{what} max abs err", _err(got, ref), BF16_STEP * _scale(ref))]


def _int8(what, got, ref) -> list:
    diff = (got.cpu().int() - ref.int()).abs()
    return [_m(f"{what} max int8 step", diff.max().item() if diff.numel() else 0.0, 1.0),
            _m(f"{what} fraction of elements differing", (diff > 0).float().mean().item(),
               INT8_DIFFERING)]


def _hidden(tokens, hidden, seed):
    torch.manual_seed(seed)
    x = torch.randn(tokens, hidden).to(BF)
    residual = (torch.randn(tokens, hidden) * 4).to(BF)   # a residual stream runs larger
    return x, residual


# ------------------------------------------------------------------------------- norms
def rms_norm() -> list:
    """vLLM's ``RMSNorm`` without a residual (``layers/norm.py``): 16 tokens, H 4096."""
    x, _ = _hidden(16, 4096, 10)
    gamma = (1 + 0.1 * torch.randn(4096)).to(BF)
    y_ref, rstd_ref = rms_norm_reference(x, gamma, 1e-6)
    y, rstd = rms_norm_npu(_npu(x), _npu(gamma), 1e-6)
    return [*_bf16("npu_rms_norm y", y, y_ref),
            _m("npu_rms_norm rstd max rel err", _rel_err(rstd, rstd_ref), 1e-3)]


def add_rms_norm() -> list:
    """``RMSNorm`` with the residual: y, rstd and the new residual ``x_out``."""
    x, residual = _hidden(16, 4096, 11)
    gamma = (1 + 0.1 * torch.randn(4096)).to(BF)
    y_ref, rstd_ref, out_ref = add_rms_norm_reference(x, residual, gamma, 1e-6)
    y, rstd, out = add_rms_norm_npu(_npu(x), _npu(residual), _npu(gamma), 1e-6)
    return [*_bf16("npu_add_rms_norm y", y, y_ref),
            _m("npu_add_rms_norm rstd max rel err", _rel_err(rstd, rstd_ref), 1e-3),
            *_rounded("npu_add_rms_norm x_out", out, out_ref)]


def gemma_rms_norm() -> list:
    """vLLM's ``GemmaRMSNorm`` (Qwen3-Next, H 2048; weight ~ 0.1 randn, bf16) both ways
    ``layers/norm.py`` calls it: ``npu_gemma_rms_norm`` on the contiguous input, and with
    a residual ``npu_add_rms_norm`` with gamma ``weight + 1.0`` added in bf16. The latter
    is also measured against vLLM's own ``1 + w`` in fp32: the reference alone is 2.3e-2
    off it here (scale 4.7), the extra rounding the layer accepts."""
    x, residual = _hidden(16, 2048, 12)
    w = (0.1 * torch.randn(2048)).to(BF)
    y_ref, rstd_ref = gemma_rms_norm_reference(x, w, 1e-6)
    y, rstd = gemma_rms_norm_npu(_npu(x.contiguous()), _npu(w), 1e-6)
    gamma = w + 1.0                                     # the layer's one add, in bf16
    ry_ref, _, rout_ref = add_rms_norm_reference(x, residual, gamma, 1e-6)
    ry, _, rout = add_rms_norm_npu(_npu(x), _npu(residual), _npu(gamma), 1e-6)
    xf = x.float() + residual.float()
    vllm = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * (1.0 + w.float())
    return [*_bf16("npu_gemma_rms_norm y", y, y_ref),
            _m("npu_gemma_rms_norm rstd max rel err", _rel_err(rstd, rstd_ref), 1e-3),
            *_bf16("npu_add_rms_norm (gamma w + 1) y", ry, ry_ref),
            *_rounded("npu_add_rms_norm (gamma w + 1) x_out", rout, rout_ref),
            # the op's 1e-2 plus the layer's rounding of 1 + w to bf16 (2^-8 relative)
            _m("npu_add_rms_norm (gamma w + 1) y vs vLLM's fp32 1 + w max abs err",
               _err(ry, vllm), (1e-2 + 2.0**-8) * _scale(vllm))]


# -------------------------------------------------------------------------------- RoPE
# name: (head_size, rotary_dim, rotary_mode, q heads, kv heads, rope_theta, max_positions)
ROPE_CASES = {
    "qwen3": (128, 128, "half", 32, 8, 1e6, 40960),
    "qwen3_next": (256, 64, "half", 16, 2, 1e7, 32768),     # partial rotary 0.25
    "interleave": (128, 64, "interleave", 32, 2, 1e4, 32768),  # GLM-4 style GPT-J, partial
}


def cos_sin_cache(rotary_dim, base, max_positions, dtype=BF) -> torch.Tensor:
    """vLLM's ``RotaryEmbedding._compute_cos_sin_cache`` (fp32, ``cat(cos, sin)``), cast to
    the model dtype as the layer registers it."""
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
    t = torch.arange(max_positions, dtype=torch.float)
    freqs = torch.einsum("i,j -> ij", t, inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dtype)


def mrope(case: str = "qwen3") -> list:
    """``npu_mrope`` in rope mode as ``layers/rope.py`` calls it: 1-D int64 positions
    (decodes deep in the context and a prefill chunk), query and key the strided
    column slices of one fused QKV output, the bf16 cos/sin cache, ``mrope_section``
    [0, 0, 0]. With partial rotary the tail of every head must pass through unchanged."""
    head, rotary, mode, nq, nk, base, max_pos = ROPE_CASES[case]
    torch.manual_seed(13)
    positions = torch.cat([torch.tensor([max_pos - 1, 31000, 4097, 517]),
                           torch.arange(1200, 1212)]).to(torch.int64)
    tokens = positions.shape[0]
    qkv = torch.randn(tokens, (nq + 2 * nk) * head).to(BF)
    cache = cos_sin_cache(rotary, base, max_pos)
    kw = dict(mrope_section=[0, 0, 0], rotary_mode=mode)

    def split(t):
        return t[:, : nq * head], t[:, nq * head:(nq + nk) * head]   # strided views

    q, k = split(qkv)
    q_ref, k_ref = mrope_reference(positions, q, k, cache, head, **kw)
    qkv_n = _npu(qkv.clone())
    qn, kn = split(qkv_n)
    q_got, k_got = mrope_npu(_npu(positions), qn.reshape(tokens, -1), kn.reshape(tokens, -1),
                             _npu(cache), head, **kw)
    label = f"npu_mrope ({case}: head {head}, rotary {rotary}, {mode})"
    out = [*_bf16(f"{label} query", q_got, q_ref), *_bf16(f"{label} key", k_got, k_ref),
           _m(f"{label} fused qkv input changed", _err(qkv_n, qkv), 0.0)]
    if rotary < head:
        def tail(t, n):
            return t.cpu().reshape(tokens, n, head)[..., rotary:]
        out.append(_m(f"{label} pass-through tail max abs change",
                      max(_err(tail(q_got, nq), tail(q, nq)), _err(tail(k_got, nk), tail(k, nk))),
                      0.0))
    return out


# ------------------------------------------------------------- add + RmsNorm + quant
def add_rms_norm_dynamic_quant() -> list:
    """The post-attention norm fused with the W8A8 MLP's activation quant as
    ``layers/norm_quant.py`` calls it (DeepSeek-V3.2's dense layers: H 7168, 16 tokens):
    int8 ``y1`` (one step at most, a few elements), ``scale1``, the new residual."""
    x, residual = _hidden(16, 7168, 14)
    gamma = (1 + 0.1 * torch.randn(7168)).to(BF)
    kw = dict(smooth_scale1=None, smooth_scale2=None, beta=None, epsilon=1e-6,
              output_mask=None, y_dtype=None)   # what npu_add_rms_norm_dynamic_quant passes
    y1_ref, _, out_ref, s1_ref, _ = add_rms_norm_dynamic_quant_reference(x, residual, gamma, **kw)
    y1, y2, out, s1, s2 = add_rms_norm_dynamic_quant_npu(_npu(x), _npu(residual), _npu(gamma),
                                                         **kw)
    return [*_int8("npu_add_rms_norm_dynamic_quant y1", y1, y1_ref),
            _m("npu_add_rms_norm_dynamic_quant scale1 max rel err", _rel_err(s1, s1_ref), 1e-2),
            *_rounded("npu_add_rms_norm_dynamic_quant x_out", out, out_ref),
            _m("npu_add_rms_norm_dynamic_quant y2/scale2 elements (no second path)",
               float(y2.numel() + s2.numel()), 0.0)]


# ------------------------------------------------------------ W8A8 fused routed experts
def moe_experts_w8a8_fused() -> list:
    """``moe/experts.routed_experts_w8a8_fused``'s first two calls (Qwen3-30B-A3B-like at
    TP 4: 64 tokens, top-8 of 128 experts, H 2048, intermediate 192): the routing
    quantizing the expanded rows (``quant_mode=1``), then ``npu_grouped_matmul_swiglu_quant``
    on the w13 experts ``[E, K, N]`` cast to FRACTAL_NZ, the groups' running sums and the
    rows' scales. Both sides of the fused GEMM take the reference's rows (isolated)."""
    torch.manual_seed(15)
    tokens, k, experts, hidden, inter = 64, 8, 128, 2048, 192
    x = torch.randn(tokens, hidden).to(BF)
    ids = torch.stack([torch.randperm(experts)[:k] for _ in range(tokens)]).int()
    kw = dict(scale=None, offset=None, active_num=-1, expert_capacity=-1, expert_num=experts,
              drop_pad_mode=0, expert_tokens_num_type=1, expert_tokens_num_flag=True,
              quant_mode=1, active_expert_range=(0, experts), row_idx_type=0, x_dtype=None)
    rows_ref, row_idx_ref, cnt_ref, rs_ref = init_routing_v2_reference(x, ids, **kw)
    rows, row_idx, cnt, rs = init_routing_v2_npu(_npu(x), _npu(ids), **kw)
    w13 = torch.randint(-127, 128, (experts, hidden, 2 * inter), dtype=torch.int8)
    w13_scale = (0.5 + torch.rand(experts, 2 * inter)) * 4e-4    # h = O(1)
    ends = cnt_ref.cumsum(0)
    a_ref, as_ref, _ = grouped_matmul_swiglu_quant_reference(rows_ref, w13, ends, w13_scale,
                                                             rs_ref)
    w13_nz = format_cast_npu(_npu(w13), ACL_FORMAT_FRACTAL_NZ)
    a, a_s, _ = grouped_matmul_swiglu_quant_npu(_npu(rows_ref), w13_nz, _npu(ends),
                                                _npu(w13_scale), _npu(rs_ref))
    return [*_int8("npu_moe_init_routing_v2 (quant_mode=1) expanded rows", rows, rows_ref),
            _m("npu_moe_init_routing_v2 (quant_mode=1) expanded scale max rel err",
               _rel_err(rs, rs_ref), 1e-2),
            _m("npu_moe_init_routing_v2 (quant_mode=1) row_idx/counts difference",
               max(_err(row_idx, row_idx_ref), _err(cnt, cnt_ref)), 0.0),
            *_int8("npu_grouped_matmul_swiglu_quant (NZ w13) output", a, a_ref),
            _m("npu_grouped_matmul_swiglu_quant (NZ w13) output scale max rel err",
               _rel_err(a_s, as_ref), 1e-2)]


# ------------------------------------------------------------ W8A8 MLP activation
def w8a8_mlp_activation() -> list:
    """``layers/w8a8_mlp.py``'s first two calls (DeepSeek-V3.2's shared expert at TP 8:
    16 tokens, H 7168, intermediate 256): ``npu_quant_matmul`` with ``output_dtype``
    int32 on the NZ ``gate_up`` weight (the raw accumulation: exact), then
    ``npu_dequant_swiglu_quant`` on the reference's accumulation (isolated) with the
    weight's per-channel and the rows' per-token scales, gate half first."""
    x, _ = _hidden(16, 7168, 16)
    xq, sx = dynamic_quant_reference(x)
    w = torch.randint(-127, 128, (7168, 512), dtype=torch.int8)
    w_scale = (0.5 + torch.rand(512)) * 2e-4                      # h = O(1)
    acc_ref = quant_matmul_reference(xq, w, w_scale, output_dtype=torch.int32)
    w_nz = format_cast_npu(_npu(w), ACL_FORMAT_FRACTAL_NZ)
    acc = quant_matmul_npu(_npu(xq), w_nz, _npu(w_scale), output_dtype=torch.int32)
    kw = dict(bias=None, quant_scale=None, quant_offset=None, group_index=None,
              activate_left=True, quant_mode=1)      # what npu_dequant_swiglu_quant passes
    y_ref, s_ref = dequant_swiglu_quant_reference(acc_ref, weight_scale=w_scale[None],
                                                  activation_scale=sx, **kw)
    y, s = dequant_swiglu_quant_npu(_npu(acc_ref), weight_scale=_npu(w_scale[None]),
                                    activation_scale=_npu(sx), **kw)
    return [_m("npu_quant_matmul (int32 out, NZ weight) max abs difference",
               float((acc.cpu().long() - acc_ref.long()).abs().max()), 0.0),
            *_int8("npu_dequant_swiglu_quant output", y, y_ref),
            _m("npu_dequant_swiglu_quant scale max rel err", _rel_err(s, s_ref), 1e-2)]
