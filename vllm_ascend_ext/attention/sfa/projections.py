"""The model weights an SFA layer computes with, in one place.

The model's attention module owns these layers (their parameters load under the
checkpoint's names); the SFA layer receives references to them at construction and
never reaches into the model. ``indexer_query`` is the indexer's query projection
for either form of ``c^Q`` the preprocessing hands on: plain, or int8 with a
per-token scale (the fused prolog's W8A8 output).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vllm_ascend_ext.quantization.w8a8_dynamic import apply_prequantized, is_w8a8


@dataclass(frozen=True, eq=False)
class SfaProjections:
    q_a_proj: nn.Module
    q_a_layernorm: nn.Module
    q_b_proj: nn.Module
    kv_a_proj_with_mqa: nn.Module
    kv_a_layernorm: nn.Module
    kv_b_proj: nn.Module
    indexer: nn.Module          # wq_b, wk_weights_proj, k_norm

    @classmethod
    def of(cls, attn: nn.Module) -> SfaProjections:
        return cls(attn.q_a_proj, attn.q_a_layernorm, attn.q_b_proj, attn.kv_a_proj_with_mqa,
                   attn.kv_a_layernorm, attn.kv_b_proj, attn.indexer)

    def indexer_query(self, q_c: torch.Tensor, q_c_scale: torch.Tensor | None,
                      dtype: torch.dtype) -> torch.Tensor:
        wq_b = self.indexer.wq_b
        if q_c_scale is None:
            return wq_b(q_c)[0]
        if is_w8a8(wq_b):
            return apply_prequantized(wq_b, q_c, q_c_scale, dtype)
        return wq_b((q_c.float() * q_c_scale).to(dtype))[0]
