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


def _cache_dir() -> Path:
    import os

    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vllm_ascend_ext"


def tiny_qwen_moe_wide_dir() -> Path:
    """Where ``tiny_qwen_moe_wide_path`` generates the wide tiny MoE (nothing written)."""
    return _cache_dir() / "tiny_qwen_moe_wide_v1"


def _generated(out: Path, make) -> str:
    """``out``, made by ``make(tmp)`` into a fresh folder beside it on first use."""
    import tempfile

    if not (out / "model.safetensors").exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out.parent))
        import shutil

        made = make(tmp)
        try:
            made.rename(out)            # atomic: a concurrent first use keeps its own copy
        except OSError:
            pass
        shutil.rmtree(tmp, ignore_errors=True)      # what was not renamed (or lost the race)
    return str(out)


def tiny_qwen_moe_wide_path() -> str:
    """The tiny Qwen MoE at hidden size 1024 (8 heads of 128), the smallest the MC2
    operators document on Atlas A3: generated deterministically on first use into
    ``$XDG_CACHE_HOME/vllm_ascend_ext`` (34 MB, not shipped)."""
    from vllm_ascend_ext.models import make_tiny_qwen_moe

    def make(tmp: Path) -> Path:
        make_tiny_qwen_moe.main(str(tmp), wide=True)
        return tmp

    return _generated(tiny_qwen_moe_wide_dir(), make)


def tiny_dsa_w8a8_wide_dir() -> Path:
    """Where ``tiny_dsa_w8a8_wide_path`` generates the wide tiny DSA W8A8 (nothing written)."""
    return _cache_dir() / "tiny_dsa_w8a8_wide_v1"


def tiny_dsa_w8a8_wide_path() -> str:
    """The tiny DeepSeek-V3.2-style W8A8 model at hidden size 1024 (the MC2 operators'
    smallest on Atlas A3): generated deterministically on first use into
    ``$XDG_CACHE_HOME/vllm_ascend_ext`` (not shipped)."""
    from vllm_ascend_ext.models import make_tiny_dsa

    def make(tmp: Path) -> Path:
        return make_tiny_dsa.main(str(tmp), wide=True)[1]

    return _generated(tiny_dsa_w8a8_wide_dir(), make)


TINY_QWEN3_NEXT = Path(__file__).resolve().parent / "tiny_qwen3_next"


def tiny_qwen3_next_path() -> str:
    """Embedded tiny Qwen3-Next model (hybrid: three Gated-DeltaNet layers, then one gated
    full-attention layer; softmax top-2 of 4 experts plus a gated shared expert; one MTP
    layer), realistic-scale weights. Stock vLLM's CPU Gated-DeltaNet runs it in bfloat16
    only."""
    return str(TINY_QWEN3_NEXT)


TINY_MIMO = Path(__file__).resolve().parent / "tiny_mimo"


def tiny_mimo_path() -> str:
    """Embedded tiny MiMo-style model (dense GQA, Qwen2 attention with biases, one MTP
    layer: ``--speculative-config '{"method": "mtp"}'`` on the FIA backend with decode
    graphs), realistic-scale weights."""
    return str(TINY_MIMO)


TINY_DSA = Path(__file__).resolve().parent / "tiny_dsa"
TINY_DSA_W8A8 = Path(__file__).resolve().parent / "tiny_dsa_w8a8"


def tiny_dsa_path(quantized: bool = False) -> str:
    """Embedded tiny DeepSeek-V3.2-style model (float, or W8A8 with a ModelSlim description),
    with one MTP layer (``--speculative-config '{"method": "mtp"}'``)."""
    return str(TINY_DSA_W8A8 if quantized else TINY_DSA)


# Architectures the plugin serves with its own model class while its platform is active.
DSA_ARCHITECTURES = ("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM")
DSA_MODEL_CLASS = "vllm_ascend_ext.models.deepseek_v32:AscendDeepseekV32ForCausalLM"
# The draft architecture vLLM names for their MTP layers (``--speculative-config`` mtp).
DSA_MTP_ARCHITECTURE = "DeepseekV32MTPModel"
DSA_MTP_MODEL_CLASS = "vllm_ascend_ext.models.dsa_mtp:AscendDsaMTP"
# Qwen3-Next with its tie_word_embeddings honoured (``qwen3_next.py``).
QWEN3_NEXT_ARCHITECTURE = "Qwen3NextForCausalLM"
QWEN3_NEXT_MODEL_CLASS = "vllm_ascend_ext.models.qwen3_next:AscendQwen3NextForCausalLM"


def register_models() -> None:
    """Serve the DSA architectures (and their MTP layers) and Qwen3-Next with the plugin's
    classes (lazy: imported on first use)."""
    from vllm import ModelRegistry

    for arch in DSA_ARCHITECTURES:
        ModelRegistry.register_model(arch, DSA_MODEL_CLASS)
    ModelRegistry.register_model(DSA_MTP_ARCHITECTURE, DSA_MTP_MODEL_CLASS)
    ModelRegistry.register_model(QWEN3_NEXT_ARCHITECTURE, QWEN3_NEXT_MODEL_CLASS)
