"""W8A8 dynamic linear method: int8 weights with per-channel scales, per-token activations.

Checkpoint tensors (ModelSlim): ``weight`` int8 [out, in], ``weight_scale`` [out, 1],
``weight_offset`` [out, 1] (symmetric: zeros). After loading, the weight is kept as
``[in, out]`` (the layout ``npu_quant_matmul`` and ``npu_mla_prolog_v3`` take), cast to
FRACTAL_NZ on A2/A3 (``quantization/weight_format.py``; the SFA prolog then shares it,
``attention/sfa/weights.py``), and the scale as fp32 [out].

Forward: ``x_q, s_x = npu_dynamic_quant(x)``;
``y = npu_quant_matmul(x_q, W, s_w, pertoken_scale=s_x, output_dtype=x.dtype)``.
A caller that already holds an int8 activation and its scale (the fused prolog's
``query_norm``) calls :func:`apply_prequantized`.

Dummy loading: vLLM initialises only floating parameters, so the int8 weight is
filled here, deterministically from the layer's name, with values spread over the
int8 range (the dummy scales then set the magnitude).
"""

from __future__ import annotations

import zlib

import torch
from vllm.model_executor.layers.linear import LinearMethodBase
from vllm.model_executor.parameter import ChannelQuantScaleParameter, ModelWeightParameter

from vllm_ascend_ext.ops.format import cast_parameter
from vllm_ascend_ext.ops.quant import npu_dynamic_quant, npu_quant_matmul
from vllm_ascend_ext.quantization.weight_format import current_quantized_weight_format


def deterministic_int8(shape: tuple[int, ...], name: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    return torch.randint(-127, 128, shape, generator=g, dtype=torch.int8)


class W8A8DynamicLinearMethod(LinearMethodBase):
    def __init__(self, prefix: str, *, dummy_loading: bool = False) -> None:
        self.prefix = prefix
        # Under dummy loading vLLM fills every float parameter, offsets included.
        self.dummy = dummy_loading

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes,
                       input_size, output_size, params_dtype, **extra_weight_attrs):
        loader = extra_weight_attrs.get("weight_loader")
        out = sum(output_partition_sizes)
        weight = ModelWeightParameter(
            data=deterministic_int8((out, input_size_per_partition), self.prefix),
            input_dim=1, output_dim=0, weight_loader=loader)
        scale = ChannelQuantScaleParameter(data=torch.empty(out, 1, dtype=torch.float32),
                                           output_dim=0, weight_loader=loader)
        offset = ChannelQuantScaleParameter(data=torch.zeros(out, 1, dtype=torch.float32),
                                            output_dim=0, weight_loader=loader)
        layer.register_parameter("weight", weight)
        layer.register_parameter("weight_scale", scale)
        layer.register_parameter("weight_offset", offset)
        layer.w8a8_output_sizes = list(output_partition_sizes)
        # decided while the model is built (the SoC and the plugin's config are current)
        self.weight_format = current_quantized_weight_format()

    def process_weights_after_loading(self, layer) -> None:
        if not self.dummy and torch.count_nonzero(layer.weight_offset.data).item():
            raise ValueError(f"{self.prefix}: W8A8_DYNAMIC weight_offset must be zero (symmetric)")
        w = layer.weight.data.t().contiguous()
        layer.weight = torch.nn.Parameter(w, requires_grad=False)
        cast_parameter(layer, "weight", self.weight_format)
        layer.weight_scale = torch.nn.Parameter(
            layer.weight_scale.data.reshape(-1).float().contiguous(), requires_grad=False)
        del layer.weight_offset

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        xq, sx = npu_dynamic_quant(x)
        return apply_prequantized(layer, xq, sx, x.dtype, bias)


def is_w8a8(linear) -> bool:
    """Whether a linear layer is served by this method (int8 [in, out] weight after loading)."""
    return isinstance(getattr(linear, "quant_method", None), W8A8DynamicLinearMethod)


def apply_prequantized(layer, xq: torch.Tensor, sx: torch.Tensor, out_dtype: torch.dtype,
                       bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = (xq @ W) * s_w * s_x (+ bias) for an int8 activation already quantized per token."""
    return npu_quant_matmul(xq, layer.weight, layer.weight_scale, pertoken_scale=sx.reshape(-1),
                            bias=bias, output_dtype=out_dtype)
