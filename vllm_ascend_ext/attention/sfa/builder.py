"""Metadata builder of the SFA backend: all per-step work, once per step.

Per step, for every SFA layer of the model together:
- the slot indices in the dtype the cache writers take (int64 for
  ``npu_kv_rmsnorm_rope_cache``, ``npu_mla_prolog_v3`` and the indexer-key write;
  vLLM already hands int64, so no cast happens; anything else is cast here, once);
- int32 cumulative query ends and KV lengths for the indexer and SFA (TND / PA_BSND);
- RoPE cos/sin gathered by position from the model's rope cache (half-duplicated); the
  positions from the KV lengths when the metadata has none (a drafter's steps);
- the step kind, from host lengths only (no device read).
Layers only consume this; nothing here is per layer.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from vllm.v1.attention.backend import (
    AttentionCGSupport,
    AttentionMetadataBuilder,
    CommonAttentionMetadata,
)

from vllm_ascend_ext.attention.kv_layout import NULL_SLOT
from vllm_ascend_ext.attention.sfa.metadata import AscendSFAMetadata


class SfaBatchError(ValueError):
    """Batch metadata the SFA backend cannot serve; names the field."""


def step_kind(query_lens: list[int]) -> str:
    if all(n == 1 for n in query_lens):
        return "decode"
    if all(n > 1 for n in query_lens):
        return "prefill"
    return "mixed"


def positions_from_lengths(query_start_loc: torch.Tensor, seq_lens: torch.Tensor, b: int,
                           t: int) -> torch.Tensor:
    """Each query token's position when the metadata carries none (vLLM's drafters build
    theirs without): a request's query rows end its sequence, so token ``j`` of ``q``
    with KV length ``L`` sits at ``L - q + j``. Device ops only."""
    ends = query_start_loc[1:b + 1].to(torch.int64)
    tokens = torch.arange(t, device=ends.device)
    req = torch.searchsorted(ends, tokens, right=True).clamp_(max=max(b - 1, 0))
    return seq_lens[:b].to(torch.int64)[req] - (ends[req] - tokens)


def half_duplicated(cos_sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's rope cache rows [cos_half | sin_half] -> (cat(cos, cos), cat(sin, sin))."""
    cos_h, sin_h = cos_sin.chunk(2, dim=-1)
    return torch.cat((cos_h, cos_h), -1), torch.cat((sin_h, sin_h), -1)


def _rope_cache(vllm_config, layer_names) -> torch.Tensor:
    from vllm.config import get_layers_from_vllm_config

    from vllm_ascend_ext.attention.sfa.layer import SfaLayer

    layers = get_layers_from_vllm_config(vllm_config, SfaLayer, layer_names)
    caches = {id(layer.rope_cos_sin): layer.rope_cos_sin for layer in layers.values()}
    if len(caches) != 1:
        raise SfaBatchError(f"SFA layers {layer_names[:2]}... must share one rope cache")
    return next(iter(caches.values()))


class AscendSFAMetadataBuilder(AttentionMetadataBuilder[AscendSFAMetadata]):
    # Graph capture is not validated for the SFA path yet: every step runs eager.
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.NEVER

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device, *, rope_cos_sin=None):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.rope_cos_sin = (rope_cos_sin if rope_cos_sin is not None
                             else _rope_cache(vllm_config, layer_names))

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> AscendSFAMetadata:
        cam = common_attn_metadata
        b = cam.num_reqs
        qsl = cam.query_start_loc_cpu[: b + 1].tolist()      # host copy: no device read
        query_lens = [qsl[i + 1] - qsl[i] for i in range(b)]
        if any(n < 0 for n in query_lens) or qsl[0] != 0:
            raise SfaBatchError(f"query_start_loc_cpu is not a cumulative sum from 0: {qsl}")
        t = qsl[-1]
        if t > cam.num_actual_tokens:
            raise SfaBatchError(
                f"query_start_loc_cpu ends at {t} but num_actual_tokens is "
                f"{cam.num_actual_tokens}"
            )
        if cam.causal is not True:
            raise SfaBatchError("SFA serves causal decoder attention only (causal=False given)")
        kind = step_kind(query_lens)
        # .to() returns the tensor itself when the dtype already matches: no copy. A
        # negative slot inside the step (model-drafted tokens past max_model_len, dummy
        # runs) points at slot 0 of vLLM's null block, which is never read: the indexer
        # key write would otherwise wrap -1 onto a live block's last row.
        slots = cam.slot_mapping[:t].to(torch.int64).clamp_min(NULL_SLOT)
        block_table = cam.block_table_tensor[:b].to(torch.int32)
        cu_q = cam.query_start_loc[1 : b + 1].to(torch.int32)
        seq_lens = cam.seq_lens[:b].to(torch.int32)
        positions = (cam.positions[:t] if cam.positions is not None
                     else positions_from_lengths(cam.query_start_loc, cam.seq_lens, b, t))
        cos, sin = half_duplicated(self.rope_cos_sin.index_select(0, positions))
        return AscendSFAMetadata(
            num_actual_tokens=t,
            num_reqs=b,
            kind=kind,
            slot_indices=slots,
            block_table=block_table,
            cu_seqlens_q=cu_q,
            seq_lens=seq_lens,
            cos=cos,
            sin=sin,
        )
