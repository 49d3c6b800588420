"""``AscendW8A8FusedMoEMethod``: routed experts quantized by ModelSlim's W8A8_DYNAMIC recipe.

The checkpoint holds, per expert and projection, an int8 ``weight [N, K]``, a float
``weight_scale [N, 1]`` (per output channel, symmetric) and a ``weight_offset [N, 1]``
(zero for the symmetric recipe; a non-zero offset is refused when the weights are
processed). vLLM's MoE weight loader fills the fused ``w13``/``w2`` parameters and, for
parameters marked per-channel, their scales and offsets. Activations are quantized per
row at run time and each grouped matmul applies both scales. After loading the experts
are ``[E, K, N]``, cast to FRACTAL_NZ on A2/A3 (``quantization/weight_format.py``). With
NZ experts the layer takes vllm-ascend's fused sequence (``experts.routed_experts_w8a8_fused``:
the routing quantizes the rows, ``npu_grouped_matmul_swiglu_quant`` runs the first GEMM,
swiglu and re-quantization in one launch; that operator treats its weight as FRACTAL_NZ
and is documented for A2/A3 only); with ND experts (Ascend 950, or
``ascend_ext.weight_nz = "off"``) the unfused one (``experts.routed_experts_w8a8``:
``npu_dynamic_quant`` before each grouped matmul, ``npu_swiglu`` between). Chosen by
``AscendExtQuantConfig`` for a MoE layer whose experts the description lists as
W8A8_DYNAMIC; routing is the same as the float method's.
"""

from __future__ import annotations

import functools

import torch
from vllm.model_executor.layers.fused_moe.fused_moe_method_base import FusedMoEMethodBase
from vllm.model_executor.layers.fused_moe.routed_experts import FusedMoeWeightScaleSupported
from vllm.model_executor.utils import set_weight_attrs

from vllm_ascend_ext.moe import experts
from vllm_ascend_ext.moe.method import MonolithicEntry, transpose_experts
from vllm_ascend_ext.moe.routing import UnsupportedMoEError
from vllm_ascend_ext.ops.format import ACL_FORMAT_FRACTAL_NZ, cast_parameter, npu_format
from vllm_ascend_ext.quantization.w8a8_dynamic import deterministic_int8
from vllm_ascend_ext.quantization.weight_format import current_quantized_weight_format


class AscendW8A8FusedMoEMethod(MonolithicEntry, FusedMoEMethodBase):
    int8_rows = True      # MC2 quantizes each token before sending it (quant_mode 2)

    def __init__(self, moe, prefix: str, *, dummy_loading: bool = False) -> None:
        super().__init__(moe)
        self.prefix = prefix
        # Under dummy loading vLLM fills float parameters only (offsets included): the
        # int8 experts are filled here, deterministically, and offsets are not checked.
        self.dummy = dummy_loading
        self.init_entry()

    @property
    def method_name(self) -> str:
        return "ascend_ext_w8a8_dynamic"

    def create_weights(self, layer, num_experts, hidden_size, intermediate_size_per_partition,
                       params_dtype, **extra_weight_attrs):
        self.plan_layer(layer)
        self.weight_format = current_quantized_weight_format()   # while the model is built
        inter = intermediate_size_per_partition
        shapes = {"w13": (num_experts, 2 * inter, hidden_size),
                  "w2": (num_experts, hidden_size, inter)}
        for stem, shape in shapes.items():
            data = (deterministic_int8(shape, f"{self.prefix}.{stem}") if self.dummy
                    else torch.empty(shape, dtype=torch.int8))
            weight = torch.nn.Parameter(data, requires_grad=False)
            layer.register_parameter(f"{stem}_weight", weight)
            set_weight_attrs(weight, extra_weight_attrs)
            for suffix in ("weight_scale", "weight_offset"):
                param = torch.nn.Parameter(torch.empty(*shape[:2], 1, dtype=torch.float32),
                                           requires_grad=False)
                layer.register_parameter(f"{stem}_{suffix}", param)
                set_weight_attrs(param, {**extra_weight_attrs,
                                         "quant_method": FusedMoeWeightScaleSupported.CHANNEL.value})

    def process_weights_after_loading(self, layer) -> None:
        self.confirm_split(layer)
        for stem in ("w13", "w2"):
            offset = getattr(layer, f"{stem}_weight_offset")
            if not self.dummy and torch.count_nonzero(offset.data).item():
                raise UnsupportedMoEError(
                    f"{self.prefix}: {stem} weight_offset is not zero; ModelSlim's "
                    "W8A8_DYNAMIC experts are symmetric (asymmetric weights are not supported)")
            scale = getattr(layer, f"{stem}_weight_scale")
            scale.data = scale.data[..., 0].float().contiguous()       # [E, N]
        transpose_experts(layer, "w13_weight", "w2_weight")
        for name in ("w13_weight", "w2_weight"):
            cast_parameter(layer, name, self.weight_format)
        # The fused first GEMM reads its weight as FRACTAL_NZ: only NZ experts take it.
        self.fused_experts = npu_format(layer.w13_weight) == ACL_FORMAT_FRACTAL_NZ
        self.place_shard(layer.w13_weight)

    # The all-to-all dispatcher delivers the rows in the activations' dtype: the experts
    # quantize them here, per row, as on one rank.
    def local_experts(self, layer, x, weights, ids, shard):
        run = (experts.routed_experts_w8a8_fused if self.fused_experts
               else experts.routed_experts_w8a8)
        return run(x, weights, ids, *_int8_experts(layer), shard)

    def grouped_experts(self, layer):
        ffn = experts.grouped_ffn_w8a8_fused if self.fused_experts else experts.grouped_ffn_w8a8
        return functools.partial(ffn, **dict(zip(("w13", "w13_scale", "w2", "w2_scale"),
                                                 _int8_experts(layer))))


def _int8_experts(layer) -> tuple[torch.Tensor, ...]:
    return layer.w13_weight, layer.w13_weight_scale, layer.w2_weight, layer.w2_weight_scale
