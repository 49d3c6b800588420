"""A post-attention RMSNorm fused with the W8A8 MLP's activation quantization.

Where a decoder layer's post-attention norm feeds only a dense MLP whose ``gate_up_proj``
is W8A8 dynamic (DeepSeek-V3.2's first dense layers), the residual add, the norm and the
per-token int8 quantization run as one ``npu_add_rms_norm_dynamic_quant`` and the
MLP consumes its int8 output and scales (its ``forward_prequantized``: the plugin's
``models/dsa_mlp.DsaMLP``, where ``gate_up_proj`` takes them instead of quantizing again,
and on A2/A3 the activation is one ``npu_dequant_swiglu_quant``, ``layers/w8a8_mlp.py``):
two launches become one, and the bf16 normalised tensor is never written. Where the norm also feeds something else
(a MoE layer's router, the SFA indexer) the int8-only output cannot serve it: those keep
``npu_add_rms_norm`` (``layers/norm.py``).
"""

from __future__ import annotations

import torch

from vllm_ascend_ext.layers.routes import FUSED, norm_quant_route
from vllm_ascend_ext.ops.add_rms_norm_quant import npu_add_rms_norm_dynamic_quant
from vllm_ascend_ext.quantization.w8a8_dynamic import is_w8a8


def takes_fused_norm_quant(mlp, layer_ops: str) -> bool:
    """Whether ``mlp`` (built) is a dense MLP taking a quantized input
    (``forward_prequantized``) whose input projection is W8A8 dynamic and the plugin's
    layer ops are on (decided once, when the layer is built)."""
    return (layer_ops == "fused" and hasattr(mlp, "forward_prequantized")
            and hasattr(mlp, "gate_up_proj") and is_w8a8(mlp.gate_up_proj)
            and getattr(mlp.gate_up_proj, "bias", None) is None
            and not getattr(mlp.gate_up_proj, "gather_output", False))


def mlp_after_norm(norm, mlp, hidden_states: torch.Tensor,
                   residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``mlp(norm(hidden_states, residual))`` and the new residual through the fused op,
    or None where the route gate says the fused op does not cover the case."""
    route, _ = norm_quant_route(hidden_states.dtype, norm.weight.dtype)
    from vllm_ascend_ext.layers.switch import contract_in_trace

    if (route != FUSED or contract_in_trace() or residual.dtype != hidden_states.dtype
            or not getattr(norm, "has_weight", True)
            or getattr(norm, "variance_size_override", None) is not None):
        return None
    xq, _, new_residual, sx, _ = npu_add_rms_norm_dynamic_quant(
        hidden_states, residual, norm.weight, epsilon=norm.variance_epsilon)
    return mlp.forward_prequantized(xq, sx, hidden_states.dtype), new_residual
