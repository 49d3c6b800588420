"""``torch_npu.npu_rms_norm`` and ``torch_npu.npu_gemma_rms_norm``.

- ``npu_rms_norm(self, gamma, epsilon=1e-6) -> (y, rstd)``: fp32 compute over the
  trailing ``gamma.dim()`` dims; ``rstd = rsqrt(mean(x^2) + eps)`` (fp32, keepdim);
  ``y = (x * rstd * gamma).to(x.dtype)``.
- ``npu_gemma_rms_norm(self, gamma, epsilon=1e-6) -> (y, rstd)``: the same with the
  Gemma scale ``(1 + gamma)`` (computed in fp32), as vLLM's ``GemmaRMSNorm``; its
  documentation asks a contiguous input and gamma in the input's dtype.

Details and sources: ``docs/operators.md``.
"""

from __future__ import annotations

import torch

from vllm_ascend_ext.ops._dispatch import torch_npu_module
from vllm_ascend_ext.ops.compiled import layer_kernel
from vllm_ascend_ext.ops.counting import npu_op
from vllm_ascend_ext.ops.op_record import NpuOp

OP = "npu_rms_norm"
KERNEL = "emu_rms_norm"


def rms_fp32(x: torch.Tensor, gamma: torch.Tensor, eps: float) -> torch.Tensor:
    """RmsNorm over the last dim in fp32: ``x * rsqrt(mean(x^2) + eps) * gamma``.

    The one formula every reference uses (the fused and native SFA routes must agree): in
    emulation the same compiled kernel as ``npu_rms_norm``'s, so that a model whose steps
    take either route (the fused prolog for some, the native chain for others) computes
    each token's norm bit for bit the same way.
    """
    x = x.float()
    kernel = _kernel_for(x, gamma) if gamma.dim() == 1 else None
    if kernel is not None:
        return kernel(x, gamma, eps)[0]
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gamma.float()


def _check(x, gamma) -> tuple[int, ...]:
    g = gamma.dim()
    if g == 0 or tuple(x.shape[-g:]) != tuple(gamma.shape):
        raise ValueError(
            f"npu_rms_norm: gamma {tuple(gamma.shape)} must match the trailing dims of "
            f"self {tuple(x.shape)}"
        )
    return tuple(range(x.dim() - g, x.dim()))


def rms_norm_reference(x, gamma, epsilon=1e-6):
    dims = _check(x, gamma)
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    return (xf * rstd * gamma.float()).to(x.dtype), rstd


def _kernel_for(x, gamma):
    """The compiled kernel (``csrc/emu_layer_ops.cpp``) where it takes these tensors."""
    return layer_kernel(KERNEL, gamma.dim(), x)


def rms_norm_emulated(x, gamma, epsilon=1e-6):
    """The emulation's RmsNorm: the compiled kernel after the reference's checks (one
    pass per row, fp32, one rounding), or the reference itself."""
    _check(x, gamma)
    kernel = _kernel_for(x, gamma)
    if kernel is None:
        return rms_norm_reference(x, gamma, epsilon)
    return kernel(x, gamma, epsilon)


def rms_norm_meta(x, gamma, epsilon=1e-6):
    dims = _check(x, gamma)
    shape = [1 if i in dims else s for i, s in enumerate(x.shape)]
    return torch.empty_like(x), x.new_empty(shape, dtype=torch.float32)


def rms_norm_npu(x, gamma, epsilon=1e-6):
    return torch_npu_module().npu_rms_norm(x, gamma, epsilon)


@npu_op(OP)
def npu_rms_norm(x: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6):
    impl = RMS_NORM.pick(x.device)
    return impl(x, gamma, epsilon)


RMS_NORM = NpuOp(OP, npu=rms_norm_npu, reference=rms_norm_reference, meta=rms_norm_meta,
                 emulation=rms_norm_emulated, kernel=KERNEL, rules="NORM_QUANT_RULES")

GEMMA_OP = "npu_gemma_rms_norm"


def gemma_rms_norm_reference(x, gamma, epsilon=1e-6):
    dims = _check(x, gamma)
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    return (xf * rstd * (1.0 + gamma.float())).to(x.dtype), rstd


def gemma_rms_norm_emulated(x, gamma, epsilon=1e-6):
    """The Gemma norm on the RmsNorm kernel, its scale ``1 + gamma`` formed in fp32 as the
    reference forms it; or the reference itself."""
    _check(x, gamma)
    kernel = _kernel_for(x, gamma)
    if kernel is None:
        return gemma_rms_norm_reference(x, gamma, epsilon)
    return kernel(x, 1.0 + gamma.float(), epsilon)


def gemma_rms_norm_npu(x, gamma, epsilon=1e-6):
    return torch_npu_module().npu_gemma_rms_norm(x, gamma, epsilon)


@npu_op(GEMMA_OP)
def npu_gemma_rms_norm(x: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6):
    impl = GEMMA_RMS_NORM.pick(x.device)
    return impl(x, gamma, epsilon)


GEMMA_RMS_NORM = NpuOp(GEMMA_OP, npu=gemma_rms_norm_npu, reference=gemma_rms_norm_reference,
                       meta=rms_norm_meta, emulation=gemma_rms_norm_emulated, kernel=KERNEL,
                       rules="LAYER_OP_RULES")
