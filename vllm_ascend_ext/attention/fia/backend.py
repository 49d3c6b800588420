"""FIA attention backend (standard decoder attention, GQA/MHA): one fused call per span.

Capabilities are declared truthfully: what the operator path cannot compute
(sliding window, sinks, ALiBi, soft-cap, fp8 KV cache, cross/encoder attention,
context parallelism, non-causal decoders) is refused at startup by the platform's
backend selection, never computed wrongly.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from vllm.v1.attention.backend import AttentionBackend, MultipleOf
from vllm.v1.kv_cache_interface import KVCacheLayout

from vllm_ascend_ext.attention.capabilities import DecoderOnlyCapabilities
from vllm_ascend_ext.ops.fia_checks import (
    EMULATION_DTYPES,
    KERNEL_BLOCK_SIZES,
    SUPPORTED_HEAD_SIZES,
)

BACKEND_NAME = "ASCEND_EXT_FIA"


class AscendFIABackend(DecoderOnlyCapabilities, AttentionBackend):
    # The forward writes K/V with the per-step int32 slots from the builder.
    forward_includes_kv_cache_update: bool = True
    supported_dtypes: ClassVar[list[torch.dtype]] = list(EMULATION_DTYPES)
    supported_kv_cache_dtypes: ClassVar[list] = ["auto", "float16", "bfloat16"]

    @staticmethod
    def get_name() -> str:
        return BACKEND_NAME

    @staticmethod
    def get_impl_cls():
        from vllm_ascend_ext.attention.fia.impl import AscendFIAImpl

        return AscendFIAImpl

    @staticmethod
    def get_builder_cls():
        from vllm_ascend_ext.attention.fia.builder import AscendFIAMetadataBuilder

        return AscendFIAMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        # 128, 256, 384, 512 (paged prefill's documented sizes), each named: vLLM serves a
        # larger block (a hybrid model's, aligned to its mamba page) through the largest of
        # them that divides it.
        return list(KERNEL_BLOCK_SIZES)

    @classmethod
    def get_preferred_block_size(cls, default_block_size: int) -> int:
        # vLLM's platform step replaces a block size the user did not pass with this; its
        # default (16) is no paged-prefill size. A hybrid model's alignment then keeps
        # multiples of it.
        return KERNEL_BLOCK_SIZES[0]

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return list(SUPPORTED_HEAD_SIZES)

    @classmethod
    def supported_kv_cache_layouts(cls) -> tuple[KVCacheLayout, ...]:
        return (KVCacheLayout.LBHNC,)

    @classmethod
    def supports_non_causal(cls) -> bool:
        return False

    @classmethod
    def supports_batch_invariance(cls) -> bool:
        # Under VLLM_BATCH_INVARIANT the gate always splits mixed steps, so a decode's
        # result never depends on a co-scheduled prefill (vllm-ascend PR 14949).
        return True
