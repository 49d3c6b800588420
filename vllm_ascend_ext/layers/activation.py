"""vLLM's ``SiluAndMul`` on ``npu_swiglu``: ``silu(x[..., :d]) * x[..., d:]`` in one launch.

The MoE methods already call ``npu_swiglu`` between their grouped matmuls; this is the
dense MLPs' and the shared experts' activation.
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.activation import SiluAndMul

from vllm_ascend_ext.layers.routes import FUSED, swiglu_route
from vllm_ascend_ext.layers.switch import PluginLayerOp, contract_in_trace
from vllm_ascend_ext.ops.grouped_matmul import npu_swiglu


class AscendSiluAndMul(PluginLayerOp, SiluAndMul):
    """vLLM's ``SiluAndMul`` (see module docstring)."""

    def forward_oot(self, x: torch.Tensor) -> torch.Tensor:
        route, _ = swiglu_route(x.dtype, x.shape[-1])
        if route != FUSED or contract_in_trace():
            return self.forward_native(x)
        return npu_swiglu(x, dim=-1)

    forward_cpu = forward_oot
