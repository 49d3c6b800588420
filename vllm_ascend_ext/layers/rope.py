"""vLLM's ``RotaryEmbedding`` on ``npu_mrope`` in rope mode: one launch for query and key.

The op gathers the cos/sin rows of the positions itself, rotates the first
``rotary_dim`` elements of every head (partial rotary included) and takes strided 2-D
query and key views as they come out of the QKV split. NeoX style is its ``'half'``
mode, GPT-J style its ``'interleave'`` mode. Other cases (``routes.rope_route``) take
vLLM's native forward. Only this exact class is replaced: vLLM's scaling variants
(YaRN, Llama 3, DeepSeek ...) are subclasses and keep their own forward.
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

from vllm_ascend_ext.layers.routes import FUSED, rope_route
from vllm_ascend_ext.layers.switch import PluginLayerOp, contract_in_trace
from vllm_ascend_ext.ops.mrope import npu_mrope


class AscendRotaryEmbedding(PluginLayerOp, RotaryEmbedding):
    """vLLM's ``RotaryEmbedding`` (see module docstring)."""

    def forward_oot(self, positions: torch.Tensor, query: torch.Tensor,
                    key: torch.Tensor | None = None):
        route, _ = rope_route(self.head_size, self.rotary_dim, query.dtype, key is not None)
        if route != FUSED or contract_in_trace():
            return self.forward_native(positions, query, key)
        cache = self._match_cos_sin_cache_dtype(query)
        positions = positions.flatten()
        tokens = positions.shape[0]
        q, k = npu_mrope(positions, query.reshape(tokens, -1), key.reshape(tokens, -1), cache,
                         self.head_size, mrope_section=[0, 0, 0],
                         rotary_mode="half" if self.is_neox_style else "interleave")
        return q.view(query.shape), k.view(key.shape)

    forward_cpu = forward_oot
