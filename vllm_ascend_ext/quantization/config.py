"""``ascend_ext`` quantization method: vLLM's view of a ModelSlim description.

Registered by the plugin (never under vllm-ascend's name ``ascend``: registering an
existing name silently replaces it) and selected automatically when a local model
directory holds ``quant_model_description.json`` and no ``--quantization`` was given
(vLLM itself only auto-detects ``config.json``'s ``quantization_config``).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

from vllm_ascend_ext.quantization.description import (
    FILENAME,
    FLOAT,
    W8A8_DYNAMIC,
    QuantDescription,
    parse,
)

METHOD_NAME = "ascend_ext"


class AscendExtQuantConfig(QuantizationConfig):
    def __init__(self, description: QuantDescription) -> None:
        super().__init__()
        self.description = description

    @classmethod
    def get_name(cls):
        return METHOD_NAME

    @classmethod
    def get_supported_act_dtypes(cls) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        return 0

    @staticmethod
    def get_config_filenames() -> list[str]:
        return [FILENAME]

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> AscendExtQuantConfig:
        return cls(parse(config))

    def get_quant_method(self, layer: torch.nn.Module, prefix: str):
        from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

        if isinstance(layer, RoutedExperts):
            if self.description.experts_type(prefix) != W8A8_DYNAMIC:
                return None      # vLLM's unquantized method (the plugin's, while active)
            from vllm.config import get_current_vllm_config

            from vllm_ascend_ext.moe.w8a8 import AscendW8A8FusedMoEMethod

            load_format = str(get_current_vllm_config().load_config.load_format)
            return AscendW8A8FusedMoEMethod(layer.moe_config, prefix,
                                            dummy_loading=load_format == "dummy")
        if not isinstance(layer, LinearBase):
            return None          # embeddings, lm head: unquantized
        last = prefix.rsplit(".", 1)[-1]
        shards = tuple(self.packed_modules_mapping.get(last, ()))
        kind = self.description.layer_type(prefix, shards)
        if kind == W8A8_DYNAMIC:
            from vllm.config import get_current_vllm_config

            from vllm_ascend_ext.quantization.w8a8_dynamic import W8A8DynamicLinearMethod

            load_format = str(get_current_vllm_config().load_config.load_format)
            return W8A8DynamicLinearMethod(prefix, dummy_loading=load_format == "dummy")
        assert kind == FLOAT
        return UnquantizedLinearMethod()


def description_path(model: str) -> str | None:
    """The description file of a local model directory, if there is one."""
    path = os.path.join(model, FILENAME)
    return path if os.path.isdir(model) and os.path.isfile(path) else None


def register() -> None:
    """Register the method under ``ascend_ext`` (idempotent; refuses to replace another)."""
    from vllm.model_executor.layers import quantization as q

    if METHOD_NAME in q.QUANTIZATION_METHODS:
        existing = q.get_quantization_config(METHOD_NAME)
        if existing is AscendExtQuantConfig:
            return
        raise RuntimeError(
            f"quantization method {METHOD_NAME!r} is already registered by {existing!r}; "
            "ascend_ext will not replace it"
        )
    from vllm.model_executor.layers.linear import (
        WEIGHT_LOADER_V2_SUPPORTED,
        register_weight_loader_v2_supported_method,
    )

    from vllm_ascend_ext.quantization.w8a8_dynamic import W8A8DynamicLinearMethod

    q.register_quantization_config(METHOD_NAME)(AscendExtQuantConfig)
    if W8A8DynamicLinearMethod.__name__ not in WEIGHT_LOADER_V2_SUPPORTED:
        register_weight_loader_v2_supported_method(W8A8DynamicLinearMethod)
