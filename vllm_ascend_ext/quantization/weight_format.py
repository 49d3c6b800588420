"""The format quantized weights take on the NPU, per SoC family (pure).

torch_npu's documentation of ``npu_quant_matmul`` recommends, on A2 and A3, casting the
``[k, n]`` weight to FRACTAL_NZ without transposing it ("推荐x2不转置直接转亲和format"), and
lists only those two products for that example ("将x2非转置(batch, k, n)后转format, ...
仅支持如下产品"). Ascend 950 is not listed: there the weights stay ND. vllm-ascend casts
its W8A8 linear and MoE weights to FRACTAL_NZ after loading; ``npu_grouped_matmul``'s
documentation says nothing about formats, so the routed experts follow the linear rule,
as vllm-ascend's do. The cast happens once, in ``process_weights_after_loading``
(``ops/format.cast_parameter``), and the ND original is released.
"""

from __future__ import annotations

from vllm_ascend_ext.ops.format import ACL_FORMAT_FRACTAL_NZ, ACL_FORMAT_ND

NZ_FAMILIES = ("A2", "A3")


def quantized_weight_format(family: str) -> int:
    """ACL format of int8 matmul weights on ``family`` (FRACTAL_NZ on A2/A3, else ND)."""
    return ACL_FORMAT_FRACTAL_NZ if family in NZ_FAMILIES else ACL_FORMAT_ND


def current_quantized_weight_format() -> int:
    """The format for the SoC the current platform serves (ND off the Ascend platforms)."""
    from vllm.platforms import current_platform

    soc = getattr(current_platform, "soc", None)
    return quantized_weight_format(soc().family) if soc is not None else ACL_FORMAT_ND
