"""How a plugin layer op is switched: on unless ``compilation_config.custom_ops`` disables
it by vLLM's custom-op name (``-rms_norm`` ...).

vLLM's own rule (``CustomOp.enabled``) also turns an op on with ``+rms_norm``, but that
entry enables every vLLM class sharing the name: the RoPE scaling variants (YaRN, Llama 3
...) are ``rotary_embedding`` too, and on the emulated platform (vLLM's CPU platform) an
enabled one runs vLLM's x86 kernel instead of the PyTorch an NPU runs. So the plugin's
classes decide for themselves, and start-up writes only the ``-`` entries of
``ascend_ext.layer_ops: "native"`` (``platform/config_hooks.layer_ops_switch``).
"""

from __future__ import annotations


class PluginLayerOp:
    """Mixin, first base of each plugin layer op class."""

    @classmethod
    def enabled(cls) -> bool:
        from vllm.config import get_cached_compilation_config

        return f"-{cls.name}" not in get_cached_compilation_config().custom_ops


def contract_in_trace() -> bool:
    """Contract mode inside a compiled model's trace: the harness (Python with locks and
    clocks) cannot run in a full graph, so the layer ops take vLLM's native forward there;
    eager runs check every layer-op call (tests/e2e/test_contract_engine.py)."""
    import torch

    from vllm_ascend_ext import envs

    return envs.npu_contract() and torch.compiler.is_compiling()
