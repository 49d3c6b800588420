"""vLLM's ``RMSNorm`` and ``GemmaRMSNorm`` on torch_npu's fused norms.

- ``RMSNorm``: ``npu_rms_norm`` (one launch); with a residual ``npu_add_rms_norm`` (the
  add and the norm in one launch, returning the new residual).
- ``GemmaRMSNorm`` (Qwen3-Next / Qwen3.5): ``npu_gemma_rms_norm``, which applies
  ``1 + w`` itself; with a residual ``npu_add_rms_norm`` with gamma ``w + 1`` formed by one
  add in the weight's dtype (vLLM forms it in fp32: in a bf16 model ``1 + w`` is rounded
  once more, as vllm-ascend's path does).

Cases the fused ops do not cover (``routes.py``) take vLLM's native forward.
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.layernorm import GemmaRMSNorm, RMSNorm

from vllm_ascend_ext.layers.routes import FUSED, gemma_norm_route, rms_norm_route
from vllm_ascend_ext.layers.switch import PluginLayerOp, contract_in_trace
from vllm_ascend_ext.ops.add_rms_norm import npu_add_rms_norm
from vllm_ascend_ext.ops.norm import npu_gemma_rms_norm, npu_rms_norm


class AscendRMSNorm(PluginLayerOp, RMSNorm):
    """vLLM's ``RMSNorm`` (see module docstring)."""

    def forward_oot(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        route, _ = rms_norm_route(x.dtype, x.dim(), self.weight.dtype, self.has_weight,
                                  self.variance_size_override,
                                  None if residual is None else residual.dtype)
        if route != FUSED or contract_in_trace():
            return self.forward_native(x, residual)
        if residual is None:
            return npu_rms_norm(x, self.weight, self.variance_epsilon)[0]
        y, _, new_residual = npu_add_rms_norm(x, residual, self.weight, self.variance_epsilon)
        return y, new_residual

    # The emulated platform is vLLM's CPU platform: vLLM dispatches it to forward_cpu.
    forward_cpu = forward_oot


class AscendGemmaRMSNorm(PluginLayerOp, GemmaRMSNorm):
    """vLLM's ``GemmaRMSNorm`` (see module docstring)."""

    def forward_oot(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        route, _ = gemma_norm_route(x.dtype, self.weight.dtype,
                                    None if residual is None else residual.dtype)
        if route != FUSED or contract_in_trace():
            return self.forward_native(x, residual)
        if residual is None:
            return npu_gemma_rms_norm(x.contiguous(), self.weight, self.variance_epsilon)[0]
        # gamma 1 + w in the input's dtype (one add), as vllm-ascend passes it: the 2.13
        # wheel documents no npu_add_rms_norm, and a mixed-dtype gamma is unverified there.
        y, _, new_residual = npu_add_rms_norm(x, residual, self.weight + 1.0,
                                              self.variance_epsilon)
        return y, new_residual

    forward_cpu = forward_oot
