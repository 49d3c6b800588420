"""Metadata builder of the FIA backend: all per-step work, once per step.

Host lists come from host copies only (``query_start_loc_cpu``,
``seq_lens_cpu_upper_bound``), never from a device read; the slot mapping is cast
to the int32 the cache writer takes here, once, and shared by every layer.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from vllm.v1.attention.backend import (
    AttentionCGSupport,
    AttentionMetadataBuilder,
    CommonAttentionMetadata,
)

from vllm_ascend_ext.attention.fia.metadata import AscendFIAMetadata
from vllm_ascend_ext.attention.fia.plan import BatchMetadataError, host_lists


class AscendFIAMetadataBuilder(AttentionMetadataBuilder[AscendFIAMetadata]):
    # FIA's host lists are baked in at capture: graphs are not supported yet.
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.NEVER

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.block_size = kv_cache_spec.block_size

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> AscendFIAMetadata:
        cam = common_attn_metadata
        if cam.seq_lens_cpu_upper_bound is None:
            raise BatchMetadataError(
                "CommonAttentionMetadata.seq_lens_cpu_upper_bound is missing: the FIA "
                "backend needs host sequence lengths and never reads them from the device"
            )
        num_reqs = cam.num_reqs
        cu_q, kv_lens = host_lists(
            cam.query_start_loc_cpu[: num_reqs + 1].tolist(),
            cam.seq_lens_cpu_upper_bound[:num_reqs].tolist(),
            cam.num_actual_tokens,
        )
        num_tokens = cu_q[-1] if cu_q else 0
        block_table = cam.block_table_tensor[:num_reqs]
        if block_table.dtype != torch.int32:
            block_table = block_table.to(torch.int32)
        causal = cam.causal
        if not isinstance(causal, bool):
            raise BatchMetadataError(
                "per-request causal flags (tensor) are not supported by the FIA backend"
            )
        return AscendFIAMetadata(
            num_actual_tokens=num_tokens,
            num_reqs=num_reqs,
            max_query_len=cam.max_query_len,
            max_seq_len=cam.max_seq_len,
            causal=causal,
            block_table=block_table,
            slot_indices=cam.slot_mapping[:num_tokens].to(torch.int32),
            actual_seq_lengths_q=cu_q,
            actual_seq_lengths_kv=kv_lens,
        )
