"""The SFA attention layer object vLLM sees (KV-cache spec, backend, forward entry).

``SfaLayer`` is an ``AttentionLayerBase`` registered in the forward context under
its prefix, like vLLM's own attention layers: the runner asks it for its cache
spec and backend, binds its cache and builds its metadata. The model calls
``torch.ops.ascend_ext.sfa_forward`` (an opaque custom op, so a compiled graph
never freezes per-step values), which finds the layer, its cache and its metadata
in the forward context and runs the backend's forward.
"""

from __future__ import annotations

import torch
from torch import nn
from vllm.config import get_current_vllm_config
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
from vllm.v1.kv_cache_interface import MLAAttentionSpec

from vllm_ascend_ext.attention.sfa.layout import SfaRow

OP_NAMESPACE = "ascend_ext"
_LIB: torch.library.Library | None = None


def _sfa_forward_body(hidden_states: torch.Tensor, output: torch.Tensor, layer_name: str) -> None:
    from vllm.model_executor.layers.attention.attention import get_attention_context

    meta, layer, kv_cache, _ = get_attention_context(layer_name)
    layer.impl.forward(layer, hidden_states, output, kv_cache, meta)


def _with_kv_transfer(fn):
    # vLLM's layer-wise KV-connector hook (P/D disaggregation): wait for the layer's KV
    # on entry, save it on exit; a no-op without a KV connector.
    from vllm.model_executor.layers.attention.kv_transfer_utils import maybe_transfer_kv_layer

    return maybe_transfer_kv_layer(fn)


def _sfa_forward_fake(hidden_states: torch.Tensor, output: torch.Tensor, layer_name: str) -> None:
    return None


def ensure_op_registered() -> None:
    """Register ``torch.ops.ascend_ext.sfa_forward`` once (the plugin's own namespace)."""
    global _LIB
    if _LIB is not None or hasattr(torch.ops, OP_NAMESPACE) and hasattr(
            getattr(torch.ops, OP_NAMESPACE), "sfa_forward"):
        return
    from vllm.utils.torch_utils import direct_register_custom_op

    from vllm_ascend_ext.ops.counting import register_transparent

    body = _with_kv_transfer(_sfa_forward_body)

    def sfa_forward(hidden_states: torch.Tensor, output: torch.Tensor, layer_name: str) -> None:
        body(hidden_states, output, layer_name)

    _LIB = torch.library.Library(OP_NAMESPACE, "FRAGMENT")
    direct_register_custom_op("sfa_forward", sfa_forward, mutates_args=["output"],
                              fake_impl=_sfa_forward_fake, target_lib=_LIB)
    register_transparent(f"{OP_NAMESPACE}.sfa_forward", sfa_forward)


class SfaLayer(nn.Module, AttentionLayerBase):
    def __init__(self, *, owner: nn.Module, impl_kwargs: dict, row: SfaRow,
                 rope_cos_sin: torch.Tensor, prefix: str) -> None:
        super().__init__()
        from vllm.v1.attention.selector import get_attn_backend

        vllm_config = get_current_vllm_config()
        cache_config = vllm_config.cache_config
        self.__dict__["owner"] = owner          # plain reference: not a submodule (no cycle)
        self.__dict__["rope_cos_sin"] = rope_cos_sin
        self.layer_name = prefix
        self.row = row
        self.kv_cache_dtype = cache_config.cache_dtype if cache_config is not None else "auto"
        self.attn_backend = get_attn_backend(
            head_size=row.width, dtype=torch.get_default_dtype(),
            kv_cache_dtype=self.kv_cache_dtype, use_mla=True, use_sparse=True)
        self.impl = self.attn_backend.get_impl_cls()(row=row, **impl_kwargs)
        self.weights = None                      # SfaWeights, set after loading
        self.route = None                        # route.Route, set at construction
        self.kv_cache = torch.tensor([])
        ctx = vllm_config.compilation_config.static_forward_context
        if prefix in ctx:
            raise ValueError(f"Duplicate layer name: {prefix}")
        ctx[prefix] = self
        ensure_op_registered()

    def get_attn_backend(self):
        return self.attn_backend

    def get_kv_cache_spec(self, vllm_config) -> MLAAttentionSpec:
        from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype

        return MLAAttentionSpec(
            block_size=vllm_config.cache_config.block_size,
            num_kv_heads=1,
            max_tp_shards=1,
            head_size=self.row.width,
            dtype=kv_cache_dtype_str_to_dtype(self.kv_cache_dtype, vllm_config.model_config),
            cache_dtype_str=self.kv_cache_dtype,
        )

    def forward(self, hidden_states: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        getattr(torch.ops, OP_NAMESPACE).sfa_forward(hidden_states, output, self.layer_name)
        return output
