"""SFA backend: DeepSeek-V3.2 / GLM-5 sparse MLA with a lightning indexer.

Declared truthfully: MLA + sparse, decoder only, three paged caches per layer
(latent, rope key, indexer key: ``caches.py``), block sizes that are multiples of 16
(the indexer, SFA and MLA-prolog kernels' requirement; the platform picks 128), no
sinks / sliding window / fp8-int8 KV cache in this version (refused at startup by the
platform's selection).

``AscendSFACacheBackend`` is the backend of the two companion cache layers (rope key,
indexer key): vLLM groups layers by backend and spec, so they need one; they have no
forward of their own (the SFA layer's forward writes and reads them) and their
metadata is a constant.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionMetadataBuilder,
    MultipleOf,
)

from vllm_ascend_ext.attention.capabilities import DecoderOnlyCapabilities

BACKEND_NAME = "ASCEND_EXT_SFA"
BLOCK_SIZE_ALIGN = 16
DEFAULT_BLOCK_SIZE = 128


class AscendSFABackend(DecoderOnlyCapabilities, AttentionBackend):
    forward_includes_kv_cache_update: bool = True
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.bfloat16, torch.float16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list] = ["auto", "float16", "bfloat16"]

    @staticmethod
    def get_name() -> str:
        return BACKEND_NAME

    @staticmethod
    def get_impl_cls():
        from vllm_ascend_ext.attention.sfa.impl import AscendSFAImpl

        return AscendSFAImpl

    @staticmethod
    def get_builder_cls():
        from vllm_ascend_ext.attention.sfa.builder import AscendSFAMetadataBuilder

        return AscendSFAMetadataBuilder

    @staticmethod
    def get_cache_backend_cls() -> type[AttentionBackend]:
        """The backend of the layer's two companion cache layers (``caches.py``)."""
        return AscendSFACacheBackend

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        return [MultipleOf(BLOCK_SIZE_ALIGN)]

    @classmethod
    def get_preferred_block_size(cls, default_block_size: int) -> int:
        # vLLM's platform step replaces a block size the user did not pass with this
        # (its default would be 16): the SFA kernels' default, as the start-up sets it.
        return DEFAULT_BLOCK_SIZE

    @classmethod
    def is_mla(cls) -> bool:
        return True

    @classmethod
    def is_sparse(cls) -> bool:
        return True


class SfaCacheMetadata:
    """The companion caches' metadata: nothing per step (the SFA metadata has it all)."""

    __slots__ = ()


SFA_CACHE_METADATA = SfaCacheMetadata()


class SfaCacheMetadataBuilder(AttentionMetadataBuilder[SfaCacheMetadata]):
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.NEVER

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)

    def build(self, common_prefix_len, common_attn_metadata, fast_build: bool = False):
        return SFA_CACHE_METADATA


class AscendSFACacheBackend(AscendSFABackend):
    """The SFA backend's declarations; its own name, builder, and no forward."""

    @staticmethod
    def get_name() -> str:
        return f"{BACKEND_NAME}_CACHE"

    @staticmethod
    def get_impl_cls():
        raise NotImplementedError("the SFA companion caches have no forward of their own")

    @staticmethod
    def get_builder_cls():
        return SfaCacheMetadataBuilder
