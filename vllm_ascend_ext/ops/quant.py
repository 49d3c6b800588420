"""``torch_npu.npu_dynamic_quant`` and ``torch_npu.npu_quant_matmul`` (W8A8 dynamic).

Semantics (``docs/npu-ops.md`` §5):

- ``npu_dynamic_quant(x, *, smooth_scales=None, ...) -> (y int8, scale fp32)``:
  per-token symmetric; ``xs = x * smooth_scales`` (if given),
  ``scale = amax(|xs|, -1) / 127`` with shape ``x.shape[:-1]``,
  ``y = round(xs / scale)`` (round half to even, as the goldens). A zero row gives
  scale 0 and y 0 [I]. Only int8 output and ``quant_mode="pertoken"`` are
  emulated; MoE ``group_index`` and int4 packing raise.
- ``npu_quant_matmul(x1, x2, scale, *, offset=None, pertoken_scale=None, bias=None,
  output_dtype=None)``: int8 ``x1 [M,K]`` x int8 ``x2 [K,N]`` with int32
  accumulation; ``out = (x1 @ x2 [+ int32 bias]) * scale[n] * pertoken_scale[m]``
  (+ offset); a bf16/fp16/fp32 bias is added after scaling. ``output_dtype``
  defaults to int8 (saturating round), else fp16/bf16/int32 (fp32 in emulation).
"""

from __future__ import annotations

import torch

from vllm_ascend_ext.ops._dispatch import torch_npu_module
from vllm_ascend_ext.ops.counting import npu_op
from vllm_ascend_ext.ops.op_record import NpuOp

DQ_OP, QMM_OP = "npu_dynamic_quant", "npu_quant_matmul"
INT8_MAX = 127.0


# ---------------------------------------------------------------- dynamic quant
def _check_dq(x, smooth_scales, group_index, dst_type, quant_mode):
    if group_index is not None:
        raise NotImplementedError("npu_dynamic_quant: group_index (MoE) is not emulated")
    if dst_type not in (None, torch.int8):
        raise NotImplementedError(f"npu_dynamic_quant: dst_type {dst_type} is not emulated (int8 only)")
    if quant_mode != "pertoken":
        raise NotImplementedError(f"npu_dynamic_quant: quant_mode {quant_mode!r} is not emulated")
    if smooth_scales is not None and smooth_scales.shape[-1] != x.shape[-1]:
        raise ValueError(
            f"npu_dynamic_quant: smooth_scales {tuple(smooth_scales.shape)} must end in "
            f"{x.shape[-1]}"
        )


def dynamic_quant_reference(x, *, smooth_scales=None, group_index=None, dst_type=None,
                            quant_mode="pertoken", dst_type_max=0.0):
    _check_dq(x, smooth_scales, group_index, dst_type, quant_mode)
    xs = x.float() if smooth_scales is None else x.float() * smooth_scales.float()
    scale = xs.abs().amax(-1) / INT8_MAX
    y = torch.round(xs / scale.clamp_min(torch.finfo(torch.float32).tiny)[..., None])
    return y.clamp(-128, 127).to(torch.int8), scale


def dynamic_quant_meta(x, *, smooth_scales=None, group_index=None, dst_type=None,
                       quant_mode="pertoken", dst_type_max=0.0):
    _check_dq(x, smooth_scales, group_index, dst_type, quant_mode)
    return (torch.empty_like(x, dtype=torch.int8),
            x.new_empty(x.shape[:-1], dtype=torch.float32))


def dynamic_quant_npu(x, **kw):
    return torch_npu_module().npu_dynamic_quant(x, **kw)


@npu_op(DQ_OP)
def npu_dynamic_quant(x: torch.Tensor, *, smooth_scales=None, group_index=None, dst_type=None,
                      quant_mode: str = "pertoken", dst_type_max: float = 0.0):
    impl = DYNAMIC_QUANT.pick(x.device)
    return impl(x, smooth_scales=smooth_scales, group_index=group_index, dst_type=dst_type,
                quant_mode=quant_mode, dst_type_max=dst_type_max)


DYNAMIC_QUANT = NpuOp(DQ_OP, npu=dynamic_quant_npu, reference=dynamic_quant_reference,
                      meta=dynamic_quant_meta, rules="NORM_QUANT_RULES")


# ---------------------------------------------------------------- quant matmul
_OUT_DTYPES = (torch.int8, torch.float16, torch.bfloat16, torch.int32, torch.float32)


def _check_qmm(x1, x2, scale, pertoken_scale, output_dtype):
    if x1.dtype != torch.int8 or x2.dtype != torch.int8:
        raise ValueError(f"npu_quant_matmul: x1/x2 must be int8, got {x1.dtype}/{x2.dtype}")
    if x1.dim() < 2 or x2.dim() != 2 or x1.shape[-1] != x2.shape[0]:
        raise ValueError(
            f"npu_quant_matmul: x1 [...,M,K] and x2 [K,N] required, got {tuple(x1.shape)} "
            f"and {tuple(x2.shape)}"
        )
    n = x2.shape[1]
    if scale.numel() not in (1, n):
        raise ValueError(f"npu_quant_matmul: scale must have 1 or {n} elements, got {scale.numel()}")
    m = x1.numel() // x1.shape[-1]
    if pertoken_scale is not None and pertoken_scale.numel() != m:
        raise ValueError(
            f"npu_quant_matmul: pertoken_scale must have {m} elements, got {pertoken_scale.numel()}"
        )
    if (output_dtype or torch.int8) not in _OUT_DTYPES:
        raise ValueError(f"npu_quant_matmul: output_dtype {output_dtype} not supported")


def quant_matmul_reference(x1, x2, scale, *, offset=None, pertoken_scale=None, bias=None,
                           output_dtype=None):
    _check_qmm(x1, x2, scale, pertoken_scale, output_dtype)
    acc = x1.to(torch.int32) @ x2.to(torch.int32)
    if bias is not None and bias.dtype == torch.int32:
        acc = acc + bias
    if output_dtype == torch.int32:
        return acc
    out = acc.double() * scale.double().reshape(-1)
    if pertoken_scale is not None:
        out = out * pertoken_scale.double().reshape(*x1.shape[:-1], 1)
    if bias is not None and bias.dtype != torch.int32:
        out = out + bias.double()
    if offset is not None:
        out = out + offset.double()
    if output_dtype in (None, torch.int8):
        return torch.round(out).clamp(-128, 127).to(torch.int8)
    return out.to(output_dtype)


def quant_matmul_meta(x1, x2, scale, *, offset=None, pertoken_scale=None, bias=None,
                      output_dtype=None):
    _check_qmm(x1, x2, scale, pertoken_scale, output_dtype)
    return x1.new_empty((*x1.shape[:-1], x2.shape[1]), dtype=output_dtype or torch.int8)


def quant_matmul_npu(x1, x2, scale, **kw):
    return torch_npu_module().npu_quant_matmul(x1, x2, scale, **kw)


@npu_op(QMM_OP)
def npu_quant_matmul(x1: torch.Tensor, x2: torch.Tensor, scale: torch.Tensor, *, offset=None,
                     pertoken_scale=None, bias=None, output_dtype=None):
    impl = QUANT_MATMUL.pick(x1.device)
    return impl(x1, x2, scale, offset=offset, pertoken_scale=pertoken_scale, bias=bias,
                output_dtype=output_dtype)


QUANT_MATMUL = NpuOp(QMM_OP, npu=quant_matmul_npu, reference=quant_matmul_reference,
                     meta=quant_matmul_meta, rules="NORM_QUANT_RULES")
