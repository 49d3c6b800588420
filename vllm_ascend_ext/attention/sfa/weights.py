"""Per-layer weights the SFA forward needs, derived once after loading.

- ``w_uk`` [N, D, Hckv] and ``w_uv`` [N, Hckv, Dv]: ``kv_b_proj`` split per head
  (absorbed MLA: queries move into the latent space, outputs move out of it);
- on the fused route, the prolog's weight set in its own layout (``[in, out]``), cast
  once to FRACTAL_NZ (``npu_format_cast``: the operator takes ``weight_dq``,
  ``weight_uq_qr`` and ``weight_dkv_kr`` in no other format), plus W8A8 dequant scales;
- with the fused route the native chain never runs, so the native-chain ("fallback")
  weights of ``q_a_proj`` / ``q_b_proj`` / ``kv_a_proj_with_mqa`` are disposed
  (``Route.dispose_fallback``) and the freed bytes reported; a W8A8 weight already in
  FRACTAL_NZ (A2/A3) *is* the prolog's weight and stays, shared, so no ND copy stays
  resident beside an NZ one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_ascend_ext.attention.sfa.projections import SfaProjections
from vllm_ascend_ext.ops.format import ACL_FORMAT_FRACTAL_NZ, ACL_FORMAT_ND, as_format
from vllm_ascend_ext.quantization.w8a8_dynamic import is_w8a8

PROLOG_SOURCES = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa")


@dataclass
class PrologWeights:
    w_dq: torch.Tensor
    w_uq_qr: torch.Tensor
    w_dkv_kr: torch.Tensor
    quantized: bool
    scale_dq: torch.Tensor | None = None
    scale_uq_qr: torch.Tensor | None = None
    scale_dkv_kr: torch.Tensor | None = None


@dataclass
class SfaWeights:
    w_uk: torch.Tensor
    w_uv: torch.Tensor
    prolog: PrologWeights | None
    fallback_bytes_freed: int = 0


def dense_weight(linear) -> torch.Tensor:
    """A linear layer's weight as float [out, in] (dequantized when W8A8)."""
    if is_w8a8(linear):
        w = as_format(linear.weight, ACL_FORMAT_ND)
        return (w.float() * linear.weight_scale[None, :]).t()
    return linear.weight


def _prolog_layout(linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    # W8A8: already [in, out] int8, and FRACTAL_NZ on A2/A3 (then shared, not copied).
    # Otherwise the cast is a new tensor; the route disposes the linear's original.
    if is_w8a8(linear):
        w, scale = linear.weight, linear.weight_scale.view(1, -1)
    else:
        w, scale = linear.weight.t().contiguous(), None
    return as_format(w, ACL_FORMAT_FRACTAL_NZ), scale


def prepare(proj: SfaProjections, *, heads: int, nope_dim: int, v_dim: int, route: str,
            dispose_fallback: bool, act_dtype: torch.dtype | None = None) -> SfaWeights:
    n, d, dv = heads, nope_dim, v_dim
    kvb = dense_weight(proj.kv_b_proj)
    if act_dtype is not None:         # a W8A8 kv_b_proj dequantizes to fp32
        kvb = kvb.to(act_dtype)
    kvb = kvb.reshape(n, d + dv, -1)
    w_uk = kvb[:, :d].contiguous()
    w_uv = kvb[:, d:].transpose(1, 2).contiguous()
    prolog = None
    freed = 0
    if route == "prolog_v3":
        (w_dq, s_dq), (w_uq, s_uq), (w_kv, s_kv) = (
            _prolog_layout(getattr(proj, name)) for name in PROLOG_SOURCES)
        quantized = is_w8a8(proj.q_a_proj)
        prolog = PrologWeights(w_dq, w_uq, w_kv, quantized, s_dq, s_uq, s_kv)
        if dispose_fallback:
            shared = {p.data_ptr() for p in (w_dq, w_uq, w_kv)}
            for name in PROLOG_SOURCES:
                lin = getattr(proj, name)
                if lin.weight.data_ptr() in shared:     # the prolog's own weight: kept
                    continue
                freed += lin.weight.numel() * lin.weight.element_size()
                lin.weight = torch.nn.Parameter(lin.weight.new_empty(0), requires_grad=False)
    return SfaWeights(w_uk, w_uv, prolog, freed)
