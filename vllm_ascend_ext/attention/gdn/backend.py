"""The plugin's GDN attention backend: vLLM's GDN backend with the plugin's builder."""

from __future__ import annotations

from vllm.v1.attention.backends.gdn_attn import GDNAttentionBackend

BACKEND_NAME = "ASCEND_EXT_GDN"


class AscendGdnBackend(GDNAttentionBackend):
    @staticmethod
    def get_name() -> str:
        return BACKEND_NAME

    @staticmethod
    def get_builder_cls():
        from vllm_ascend_ext.attention.gdn.builder import AscendGdnMetadataBuilder

        return AscendGdnMetadataBuilder
