"""Embedded tiny models (package data), so serving and tests need no download."""

from __future__ import annotations

from pathlib import Path

TINY_QWEN3 = Path(__file__).resolve().parent / "tiny_qwen3"


def tiny_model_path() -> str:
    """Directory of the embedded tiny Qwen3-style model (realistic-scale weights)."""
    return str(TINY_QWEN3)


TINY_QWEN_MOE = Path(__file__).resolve().parent / "tiny_qwen_moe"


def tiny_qwen_moe_path() -> str:
    """Embedded tiny Qwen MoE model (Qwen2-MoE architecture: softmax top-2 of 8 experts,
    renormalised, and a gated shared expert), realistic-scale weights."""
    return str(TINY_QWEN_MOE)


TINY_QWEN3_NEXT = Path(__file__).resolve().parent / "tiny_qwen3_next"


def tiny_qwen3_next_path() -> str:
    """Embedded tiny Qwen3-Next model (hybrid: three Gated-DeltaNet layers, then one gated
    full-attention layer; softmax top-2 of 4 experts plus a gated shared expert), realistic-scale
    weights. Stock vLLM's CPU Gated-DeltaNet runs it in bfloat16 only."""
    return str(TINY_QWEN3_NEXT)


TINY_DSA = Path(__file__).resolve().parent / "tiny_dsa"
TINY_DSA_W8A8 = Path(__file__).resolve().parent / "tiny_dsa_w8a8"


def tiny_dsa_path(quantized: bool = False) -> str:
    """Embedded tiny DeepSeek-V3.2-style model (float, or W8A8 with a ModelSlim description)."""
    return str(TINY_DSA_W8A8 if quantized else TINY_DSA)


# Architectures the plugin serves with its own model class while its platform is active.
DSA_ARCHITECTURES = ("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM")
DSA_MODEL_CLASS = "vllm_ascend_ext.models.deepseek_v32:AscendDeepseekV32ForCausalLM"


def register_models() -> None:
    """Serve the DSA architectures and Qwen3-Next with the plugin's classes (lazy: imported
    on first use)."""
    from vllm import ModelRegistry

    for arch in DSA_ARCHITECTURES:
        ModelRegistry.register_model(arch, DSA_MODEL_CLASS)
    ModelRegistry.register_model("Qwen3NextForCausalLM",
                                 "vllm_ascend_ext.models.qwen3_next:AscendQwen3NextForCausalLM")
