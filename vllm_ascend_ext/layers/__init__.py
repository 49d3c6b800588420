"""The plugin's layer ops outside attention and MoE: vLLM's ``RMSNorm``,
``GemmaRMSNorm``, ``RotaryEmbedding`` and ``SiluAndMul`` on torch_npu's fused operators.

Registered with ``CustomOp.register_oot`` while the plugin's platform is active
(``vllm_ascend_ext.register``), each under vLLM's class name, so every model vLLM builds
gets them; each keeps vLLM's custom-op name (``rms_norm`` ...) and is on unless
``compilation_config.custom_ops`` holds ``-rms_norm`` ... (``layers/switch.py``), which
the start-up writes for ``ascend_ext.layer_ops: "native"`` (vLLM's PyTorch
implementations; the default "fused" writes nothing) (``platform/config_hooks``).
"""

from __future__ import annotations

# vLLM class name -> vLLM custom-op name (what compilation_config.custom_ops names).
REPLACED = {"RMSNorm": "rms_norm", "GemmaRMSNorm": "gemma_rms_norm",
            "RotaryEmbedding": "rotary_embedding", "SiluAndMul": "silu_and_mul"}


def custom_op_names() -> tuple[str, ...]:
    return tuple(REPLACED.values())


def classes() -> dict[str, type]:
    """vLLM class name -> the plugin's class replacing it."""
    from vllm_ascend_ext.layers.activation import AscendSiluAndMul
    from vllm_ascend_ext.layers.norm import AscendGemmaRMSNorm, AscendRMSNorm
    from vllm_ascend_ext.layers.rope import AscendRotaryEmbedding

    return {"RMSNorm": AscendRMSNorm, "GemmaRMSNorm": AscendGemmaRMSNorm,
            "RotaryEmbedding": AscendRotaryEmbedding, "SiluAndMul": AscendSiluAndMul}


def register() -> None:
    """Make vLLM build the plugin's layer ops in place of its own (idempotent)."""
    from vllm.model_executor.custom_op import CustomOp, op_registry_oot

    for key, cls in classes().items():
        current = op_registry_oot.get(key)
        if current is cls:
            continue
        if current is not None:
            raise RuntimeError(f"{key} is already replaced by {current!r}; ascend_ext will "
                               "not replace it")
        CustomOp.register_oot(cls, name=key)
        # register_oot names the op after the class; keep vLLM's custom-op name so that
        # compilation_config.custom_ops ("+rms_norm" / "-rms_norm") switches it.
        cls.name = REPLACED[key]
