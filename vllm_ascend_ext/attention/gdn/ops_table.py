"""Which operator computes each part of a GDN layer, per SoC family (pure).

torch_npu 2.13 documents ``npu_recurrent_gated_delta_rule`` and
``npu_chunk_gated_delta_rule`` for Atlas A2 / A3 ("支持的型号"), and
``npu_fused_causal_conv1d`` for Ascend 950 only, with a kernel width fixed at 3 and no
activation or bias (Qwen3-Next / Qwen3.5 convolve over 4 tokens, then SiLU). Where
torch_npu documents nothing usable, the plugin's own ``_C_ascend_ext`` op serves.
README's op-by-SoC table is this one.
"""

from __future__ import annotations

from dataclasses import dataclass

RECURRENT = "npu_recurrent_gated_delta_rule"
CHUNK = "npu_chunk_gated_delta_rule"
OWN_RECURRENT = "_C_ascend_ext.npu_recurrent_gated_delta_rule_ext"
OWN_CONV = "_C_ascend_ext.npu_causal_conv1d_ext"
GATES = "composite (ATen): g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b)"
TORCH_NPU_GDN_FAMILIES = ("A2", "A3")


@dataclass(frozen=True)
class GdnOps:
    conv: str
    decode: str    # decode and speculative verify
    prefill: str
    gates: str = GATES

    @property
    def torch_npu_recurrence(self) -> bool:
        return self.decode == RECURRENT


def gdn_ops_for(family: str) -> GdnOps:
    if family in TORCH_NPU_GDN_FAMILIES:
        return GdnOps(conv=OWN_CONV, decode=RECURRENT, prefill=CHUNK)
    return GdnOps(conv=OWN_CONV, decode=OWN_RECURRENT, prefill=OWN_RECURRENT)
