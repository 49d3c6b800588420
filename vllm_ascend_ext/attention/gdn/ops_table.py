"""Which operator computes each part of a GDN layer, per SoC family (pure).

torch_npu 2.13 documents ``npu_recurrent_gated_delta_rule`` and
``npu_chunk_gated_delta_rule`` for Atlas A2 / A3 ("支持的型号"), and
``npu_fused_causal_conv1d`` for Ascend 950 only, with a kernel width fixed at 3 and no
activation or bias (Qwen3-Next / Qwen3.5 convolve over 4 tokens, then SiLU). Where
torch_npu documents nothing usable, the plugin's own ``_C_ascend_ext`` op serves.
docs/contract-mode.md's op-by-SoC table is this one.
"""

from __future__ import annotations

from dataclasses import dataclass

RECURRENT = "npu_recurrent_gated_delta_rule"
CHUNK = "npu_chunk_gated_delta_rule"
OWN_RECURRENT = "_C_ascend_ext.npu_recurrent_gated_delta_rule_ext"
OWN_CONV = "_C_ascend_ext.npu_causal_conv1d_ext"
GATES = "composite (ATen): g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b)"
TORCH_NPU_GDN_FAMILIES = ("A2", "A3")
TORCH_NPU_MAX_TOKENS = 8          # npu_recurrent_gated_delta_rule: "L_i <= 8"
TORCH_NPU_STATE_DTYPE = "bfloat16"  # "state ... 数据类型支持bfloat16"


@dataclass(frozen=True)
class GdnOps:
    conv: str
    decode: str    # decode and speculative verify
    prefill: str
    gates: str = GATES

    why: str = ""

    @property
    def torch_npu_recurrence(self) -> bool:
        return self.decode == RECURRENT


def gdn_ops_for(family: str, *, num_spec: int = 0, state_dtype: str | None = None) -> GdnOps:
    """``state_dtype``: the recurrent state's dtype where the kernels' documented dtypes
    bind (an NPU, or contract mode); None in plain emulation, whose references also take
    fp32 states (as the FIA references take fp32 models)."""
    own = GdnOps(conv=OWN_CONV, decode=OWN_RECURRENT, prefill=OWN_RECURRENT)
    if family not in TORCH_NPU_GDN_FAMILIES:
        return GdnOps(**{**vars(own), "why": f"torch_npu documents no GDN op for {family}"})
    if state_dtype is not None and state_dtype != TORCH_NPU_STATE_DTYPE:
        return GdnOps(**{**vars(own), "why": f"{state_dtype} recurrent state (mamba_ssm_cache_"
                                              f"dtype); torch_npu's GDN ops take bfloat16"})
    if num_spec + 1 > TORCH_NPU_MAX_TOKENS:
        return GdnOps(conv=OWN_CONV, decode=OWN_RECURRENT, prefill=CHUNK,
                      why=f"{num_spec} speculative tokens: verify rows exceed "
                          f"npu_recurrent_gated_delta_rule's {TORCH_NPU_MAX_TOKENS} tokens")
    return GdnOps(conv=OWN_CONV, decode=RECURRENT, prefill=CHUNK)
