"""``torch_npu.npu_add_rms_norm(x1, x2, gamma, epsilon=1e-6) -> (y, rstd, x_out)``.

The residual add fused into RmsNorm: ``x = x1 + x2`` and its normalisation in one launch.
torch-npu 2.13 ships the schema and the official Meta kernel but no documentation page
(contract mode reports its products as unspecified). Semantics (``docs/operators.md``):

- the add runs in fp32: ``x = float(x1) + float(x2)``; ``x_out = x.to(x1.dtype)``
  (the new residual);
- ``rstd = rsqrt(mean(x^2 over gamma's trailing dims) + eps)`` (fp32, keepdim), computed
  on the fp32 sum (not on the rounded ``x_out``);
- ``y = (x * rstd * float(gamma)).to(x1.dtype)``.

That is vLLM's ``fused_add_rms_norm`` with one rounding of the normalised value instead
of two (vLLM rounds ``x * rstd`` to the weight's dtype before multiplying by it).
"""

from __future__ import annotations

import torch

from vllm_ascend_ext.ops._dispatch import torch_npu_module
from vllm_ascend_ext.ops.compiled import layer_kernel
from vllm_ascend_ext.ops.counting import npu_op
from vllm_ascend_ext.ops.op_record import NpuOp

OP = "npu_add_rms_norm"
KERNEL = "emu_add_rms_norm"


def _check(x1, x2, gamma) -> tuple[int, ...]:
    if x1.shape != x2.shape or x1.dtype != x2.dtype:
        raise ValueError(f"npu_add_rms_norm: x1 {tuple(x1.shape)} {x1.dtype} and x2 "
                         f"{tuple(x2.shape)} {x2.dtype} must have one shape and dtype")
    g = gamma.dim()
    if g == 0 or tuple(x1.shape[-g:]) != tuple(gamma.shape):
        raise ValueError(f"npu_add_rms_norm: gamma {tuple(gamma.shape)} must match the "
                         f"trailing dims of x1 {tuple(x1.shape)}")
    return tuple(range(x1.dim() - g, x1.dim()))


def add_and_normalise(x1, x2, gamma, epsilon=1e-6):
    """The fp32 sum, its rstd and the fp32 normalised value (before any rounding)."""
    dims = _check(x1, x2, gamma)
    x = x1.float() + x2.float()
    rstd = torch.rsqrt(x.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    return x, rstd, x * rstd * gamma.float()


def add_rms_norm_reference(x1, x2, gamma, epsilon=1e-6):
    x, rstd, y = add_and_normalise(x1, x2, gamma, epsilon)
    return y.to(x1.dtype), rstd, x.to(x1.dtype)


def add_rms_norm_emulated(x1, x2, gamma, epsilon=1e-6):
    """The compiled kernel (``csrc/emu_layer_ops.cpp``: the fp32 add, its normalisation and
    both roundings in one pass per row) after the reference's checks, or the reference."""
    _check(x1, x2, gamma)
    kernel = layer_kernel(KERNEL, gamma.dim(), x1, x2)
    if kernel is None:
        return add_rms_norm_reference(x1, x2, gamma, epsilon)
    return kernel(x1, x2, gamma, epsilon)


def add_rms_norm_meta(x1, x2, gamma, epsilon=1e-6):
    dims = _check(x1, x2, gamma)
    shape = [1 if i in dims else s for i, s in enumerate(x1.shape)]
    return torch.empty_like(x1), x1.new_empty(shape, dtype=torch.float32), torch.empty_like(x1)


def add_rms_norm_npu(x1, x2, gamma, epsilon=1e-6):
    return torch_npu_module().npu_add_rms_norm(x1, x2, gamma, epsilon)


@npu_op(OP)
def npu_add_rms_norm(x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor,
                     epsilon: float = 1e-6):
    impl = ADD_RMS_NORM.pick(x1.device)
    return impl(x1, x2, gamma, epsilon)


ADD_RMS_NORM = NpuOp(OP, npu=add_rms_norm_npu, reference=add_rms_norm_reference,
                     meta=add_rms_norm_meta, emulation=add_rms_norm_emulated, kernel=KERNEL)
