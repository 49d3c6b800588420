"""The format quantized weights take on the NPU, per SoC family (pure).

torch_npu's documentation of ``npu_quant_matmul`` recommends, on A2 and A3, casting the
``[k, n]`` weight to FRACTAL_NZ without transposing it ("推荐x2不转置直接转亲和format"), and
lists only those two products for that example ("将x2非转置(batch, k, n)后转format, ...
仅支持如下产品"). Ascend 950 is not listed: there the weights stay ND. vllm-ascend casts
its W8A8 linear and MoE weights to FRACTAL_NZ after loading; ``npu_grouped_matmul``'s
documentation says nothing about formats, so the routed experts follow the linear rule,
as vllm-ascend's do. The cast happens once, in ``process_weights_after_loading``
(``ops/format.cast_parameter``), and the ND original is released.
``ascend_ext.weight_nz = "off"`` keeps every int8 weight ND (a way around a CANN or
torch_npu release that mishandles them, as vllm-ascend's ``VLLM_ASCEND_ENABLE_NZ=0``).
"""

from __future__ import annotations

from vllm_ascend_ext.config import WEIGHT_NZ_CHOICES
from vllm_ascend_ext.ops.format import ACL_FORMAT_FRACTAL_NZ, ACL_FORMAT_ND

NZ_FAMILIES = ("A2", "A3")


def quantized_weight_format(family: str, setting: str = "auto") -> int:
    """ACL format of int8 matmul weights on ``family`` (FRACTAL_NZ on A2/A3, else ND;
    ND everywhere with ``setting="off"``)."""
    if setting not in WEIGHT_NZ_CHOICES:
        raise ValueError(f"weight_nz={setting!r} not in {WEIGHT_NZ_CHOICES}")
    return ACL_FORMAT_FRACTAL_NZ if setting == "auto" and family in NZ_FAMILIES else ACL_FORMAT_ND


def current_quantized_weight_format() -> int:
    """The format for the SoC the current platform serves and the plugin's config (ND
    off the Ascend platforms)."""
    from vllm.config import get_current_vllm_config_or_none

    from vllm_ascend_ext.config import get_config
    from vllm_ascend_ext.platform.soc import current_family

    family = current_family()
    if family is None:
        return ACL_FORMAT_ND
    vllm_config = get_current_vllm_config_or_none()
    setting = get_config(vllm_config).weight_nz if vllm_config is not None else "auto"
    return quantized_weight_format(family, setting)
