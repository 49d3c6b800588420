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

from vllm_ascend_ext.ops.gdn_bounds import CHUNK_HEAD_DIM, CHUNK_MAX_HEADS, RECURRENT_MAX

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


@dataclass(frozen=True)
class HeadShape:
    """A rank's GDN heads: key / value head counts and head dims."""
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int


def recurrent_shape_refusal(shape: HeadShape) -> str | None:
    big = [f"{name}={n}" for name, n in (("Nk", shape.num_k_heads), ("Nv", shape.num_v_heads),
                                         ("Dk", shape.head_k_dim), ("Dv", shape.head_v_dim))
           if n > RECURRENT_MAX]
    return (f"{', '.join(big)}: {RECURRENT} documents at most {RECURRENT_MAX}" if big else None)


def chunk_shape_refusal(shape: HeadShape) -> str | None:
    bad = [f"{name}={n}" for name, n in (("Nk", shape.num_k_heads), ("Nv", shape.num_v_heads))
           if n > CHUNK_MAX_HEADS]
    bad += [f"{name}={n}" for name, n in (("Dk", shape.head_k_dim), ("Dv", shape.head_v_dim))
            if n != CHUNK_HEAD_DIM]
    if shape.num_v_heads % shape.num_k_heads:
        bad.append(f"Nv={shape.num_v_heads} not a multiple of Nk={shape.num_k_heads}")
    return (f"{', '.join(bad)}: {CHUNK} documents N <= {CHUNK_MAX_HEADS}, D = "
            f"{CHUNK_HEAD_DIM}, Nv a multiple of Nk" if bad else None)


def gdn_ops_for(family: str, *, num_spec: int = 0, state_dtype: str | None = None,
                shape: HeadShape | None = None) -> GdnOps:
    """``state_dtype``: the recurrent state's dtype where the kernels' documented dtypes
    bind (an NPU, or contract mode); None in plain emulation, whose references also take
    fp32 states (as the FIA references take fp32 models). ``shape``: the rank's heads,
    held to each torch_npu op's documented bounds where they bind (as the dtype: an NPU or
    contract mode; plain emulation's references take any head shape)."""
    own = GdnOps(conv=OWN_CONV, decode=OWN_RECURRENT, prefill=OWN_RECURRENT)
    if family not in TORCH_NPU_GDN_FAMILIES:
        return GdnOps(**{**vars(own), "why": f"torch_npu documents no GDN op for {family}"})
    if state_dtype is not None and state_dtype != TORCH_NPU_STATE_DTYPE:
        return GdnOps(**{**vars(own), "why": f"{state_dtype} recurrent state (mamba_ssm_cache_"
                                              f"dtype); torch_npu's GDN ops take bfloat16"})
    decode, prefill, why = RECURRENT, CHUNK, []
    if num_spec + 1 > TORCH_NPU_MAX_TOKENS:
        decode = OWN_RECURRENT
        why.append(f"{num_spec} speculative tokens: verify rows exceed "
                   f"{RECURRENT}'s {TORCH_NPU_MAX_TOKENS} tokens")
    if shape is not None and state_dtype is not None:   # the documented bounds bind
        if decode == RECURRENT and (refusal := recurrent_shape_refusal(shape)):
            decode = OWN_RECURRENT
            why.append(refusal)
        if refusal := chunk_shape_refusal(shape):
            prefill = OWN_RECURRENT
            why.append(refusal)
    return GdnOps(conv=OWN_CONV, decode=decode, prefill=prefill, why="; ".join(why))
