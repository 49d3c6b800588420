"""A W8A8 dense MLP (``gate_up_proj`` -> SiLU-and-mul -> ``down_proj``) whose activation is
one launch: the dequantization, the SwiGLU and the re-quantization of ``down_proj``'s input.

Unfused, vLLM's MLP forward with the W8A8 linear method is
``npu_dynamic_quant`` -> ``npu_quant_matmul`` (bf16 out) -> ``npu_swiglu`` ->
``npu_dynamic_quant`` -> ``npu_quant_matmul``. Here ``gate_up_proj`` keeps its raw int32
accumulation (``npu_quant_matmul(output_dtype=torch.int32)``, documented for A2/A3 without
a per-token scale) and ``npu_dequant_swiglu_quant`` dequantizes it with the weight's
per-channel and the activation's per-token scales, applies SwiGLU (gate first,
``activate_left=True``, vLLM's ``SiluAndMul`` layout) and quantizes per token for
``down_proj``: four launches instead of five per MLP, as vllm-ascend's W8A8 shared expert runs
(``vllm_ascend/ops/fused_moe/shared_experts.py``). The numerics differ from the unfused
chain only by the bf16 rounding of the GEMM output and of the SwiGLU, which the fused op
does not do.

Used by DeepSeek-V3.2's shared experts (after ``npu_dynamic_quant``) and its dense MLPs
(after the post-attention norm's fused quantization, ``layers/norm_quant.py``). The route
(``w8a8_mlp_route``) is decided once, when the layer is built: on A2/A3 (the SoCs the
operator's documentation lists) with the plugin's layer ops on; elsewhere the MLP runs
vLLM's forward.
"""

from __future__ import annotations

import torch

from vllm_ascend_ext.layers.routes import FUSED, NATIVE
from vllm_ascend_ext.ops.dequant_swiglu_quant import npu_dequant_swiglu_quant
from vllm_ascend_ext.ops.quant import npu_dynamic_quant, npu_quant_matmul
from vllm_ascend_ext.quantization.w8a8_dynamic import apply_prequantized, is_w8a8

DSQ_FAMILIES = ("A2", "A3")


def w8a8_mlp_route(family: str | None, layer_ops: str) -> tuple[str, str]:
    """Whether a W8A8 MLP's activation takes ``npu_dequant_swiglu_quant`` (pure)."""
    if layer_ops != "fused":
        return NATIVE, f"ascend_ext.layer_ops={layer_ops!r}"
    if family not in DSQ_FAMILIES:
        return NATIVE, (f"SoC family {family}: npu_dequant_swiglu_quant and npu_quant_matmul's "
                        "int32 output are documented for A2/A3 only")
    return FUSED, "npu_quant_matmul (int32) -> npu_dequant_swiglu_quant -> npu_quant_matmul"


def fusable_w8a8_mlp(mlp) -> bool:
    """Whether ``mlp`` (built) is the shape this path computes: W8A8 ``gate_up_proj`` and
    ``down_proj`` without bias, a SiLU-and-mul activation, no gathered output, a
    ``down_proj`` taking its input already split."""
    from vllm.model_executor.layers.activation import SiluAndMul

    gate_up, down = getattr(mlp, "gate_up_proj", None), getattr(mlp, "down_proj", None)
    return (gate_up is not None and down is not None
            and isinstance(getattr(mlp, "act_fn", None), SiluAndMul)
            and is_w8a8(gate_up) and is_w8a8(down)
            and getattr(gate_up, "bias", None) is None and getattr(down, "bias", None) is None
            and not getattr(gate_up, "gather_output", False)
            and getattr(down, "input_is_parallel", True))


def takes_fused_w8a8_mlp(mlp, layer_ops: str, family: str | None) -> bool:
    """Decided once per layer when it is built."""
    return fusable_w8a8_mlp(mlp) and w8a8_mlp_route(family, layer_ops)[0] == FUSED


def w8a8_mlp_prequantized(mlp, xq: torch.Tensor, sx: torch.Tensor,
                          out_dtype: torch.dtype) -> torch.Tensor:
    """``mlp``'s output for an activation already quantized per token (``xq`` int8 [T, H],
    ``sx`` fp32 [T]), reduced over tensor parallelism as ``down_proj`` would."""
    gate_up, down = mlp.gate_up_proj, mlp.down_proj
    acc = npu_quant_matmul(xq, gate_up.weight, gate_up.weight_scale, output_dtype=torch.int32)
    yq, ys = npu_dequant_swiglu_quant(acc, weight_scale=gate_up.weight_scale.reshape(1, -1),
                                      activation_scale=sx.reshape(-1), activate_left=True,
                                      quant_mode=1)
    out = apply_prequantized(down, yq, ys, out_dtype)
    if down.reduce_results and down.tp_size > 1:
        from vllm.distributed import tensor_model_parallel_all_reduce

        out = tensor_model_parallel_all_reduce(out)
    return out


def w8a8_mlp(mlp, x: torch.Tensor) -> torch.Tensor:
    """``mlp(x)`` with the fused activation (the caller decided the route)."""
    xq, sx = npu_dynamic_quant(x)
    return w8a8_mlp_prequantized(mlp, xq, sx, x.dtype)
