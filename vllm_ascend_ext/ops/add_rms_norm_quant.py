"""``torch_npu.npu_add_rms_norm_dynamic_quant``: the residual add, RmsNorm and per-token
dynamic int8 quantization in one launch (W8A8 linears consume its output directly).

``npu_add_rms_norm_dynamic_quant(x1, x2, gamma, *, smooth_scale1=None, smooth_scale2=None,
beta=None, epsilon=1e-6, output_mask=None, y_dtype=None) -> (y1, y2, x_out, scale1, scale2)``

Semantics (its torch-npu 2.13 documentation; ``docs/operators.md``): ``x = x1 + x2``
(fp32; ``x_out`` is it in x1's dtype), ``y = RmsNorm(x) * gamma (+ beta)``; each
quantization path ``i`` multiplies by ``smooth_scale_i`` when given, then
``scale_i = rowMax(|y_i|) / 127`` and ``y_i = round(y_i / scale_i)`` in int8, as
``npu_dynamic_quant``. The second path is output only with ``smooth_scale2`` (or
``output_mask``); otherwise ``y2`` / ``scale2`` are empty, as the official Meta kernel
shapes them. The reference quantizes the fp32 normalised value (the kernel does not
round it to the input dtype in between). Emulated: int8 output (``y_dtype`` None/int8).
"""

from __future__ import annotations

import torch

from vllm_ascend_ext.ops._dispatch import torch_npu_module
from vllm_ascend_ext.ops.add_rms_norm import add_and_normalise
from vllm_ascend_ext.ops.counting import npu_op
from vllm_ascend_ext.ops.op_record import NpuOp
from vllm_ascend_ext.ops.quant import dynamic_quant_reference

OP = "npu_add_rms_norm_dynamic_quant"


def _paths(smooth_scale1, smooth_scale2, output_mask) -> tuple[bool, bool]:
    if output_mask is None:
        return True, smooth_scale1 is not None and smooth_scale2 is not None
    if not any(output_mask):
        raise ValueError(f"{OP}: output_mask {list(output_mask)} asks for no output")
    return bool(output_mask[0]), bool(output_mask[1])


def _check(x1, gamma, beta, y_dtype) -> None:
    if gamma.dim() != 1 or gamma.shape[0] != x1.shape[-1]:
        raise ValueError(f"{OP}: gamma {tuple(gamma.shape)} must be 1-D of x1's last dim "
                         f"{x1.shape[-1]}")
    if beta is not None and beta.shape != gamma.shape:
        raise ValueError(f"{OP}: beta {tuple(beta.shape)} must be shaped as gamma")
    if y_dtype not in (None, torch.int8):
        raise NotImplementedError(f"{OP}: y_dtype {y_dtype} is not emulated (int8 only)")


def add_rms_norm_dynamic_quant_reference(x1, x2, gamma, *, smooth_scale1=None,
                                         smooth_scale2=None, beta=None, epsilon=1e-6,
                                         output_mask=None, y_dtype=None):
    _check(x1, gamma, beta, y_dtype)
    out1, out2 = _paths(smooth_scale1, smooth_scale2, output_mask)
    x, _, y = add_and_normalise(x1, x2, gamma, epsilon)     # y in fp32, not rounded
    if beta is not None:
        y = y + beta.float()
    x_out = x.to(x1.dtype)
    empty_y, empty_s = x1.new_empty((0,), dtype=torch.int8), x1.new_empty((0,), dtype=torch.float32)
    results = []
    for wanted, smooth in ((out1, smooth_scale1), (out2, smooth_scale2)):
        results.append(dynamic_quant_reference(y, smooth_scales=smooth) if wanted
                       else (empty_y, empty_s))
    (y1, s1), (y2, s2) = results
    return y1, y2, x_out, s1, s2


def add_rms_norm_dynamic_quant_meta(x1, x2, gamma, *, smooth_scale1=None, smooth_scale2=None,
                                    beta=None, epsilon=1e-6, output_mask=None, y_dtype=None):
    _check(x1, gamma, beta, y_dtype)
    out1, out2 = _paths(smooth_scale1, smooth_scale2, output_mask)

    def y(wanted):
        return x1.new_empty(x1.shape if wanted else (0,), dtype=torch.int8)

    def s(wanted):
        return x1.new_empty(x1.shape[:-1] if wanted else (0,), dtype=torch.float32)

    return y(out1), y(out2), torch.empty_like(x1), s(out1), s(out2)


def add_rms_norm_dynamic_quant_npu(x1, x2, gamma, **kw):
    return torch_npu_module().npu_add_rms_norm_dynamic_quant(x1, x2, gamma, **kw)


@npu_op(OP)
def npu_add_rms_norm_dynamic_quant(x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor, *,
                                   smooth_scale1=None, smooth_scale2=None, beta=None,
                                   epsilon: float = 1e-6, output_mask=None, y_dtype=None):
    impl = ADD_RMS_NORM_DYNAMIC_QUANT.pick(x1.device)
    return impl(x1, x2, gamma, smooth_scale1=smooth_scale1, smooth_scale2=smooth_scale2,
                beta=beta, epsilon=epsilon, output_mask=output_mask, y_dtype=y_dtype)


ADD_RMS_NORM_DYNAMIC_QUANT = NpuOp(OP, npu=add_rms_norm_dynamic_quant_npu,
                                   reference=add_rms_norm_dynamic_quant_reference,
                                   meta=add_rms_norm_dynamic_quant_meta, rules="LAYER_OP_RULES")
