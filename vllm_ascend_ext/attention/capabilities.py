"""What neither plugin backend computes, declared once (vLLM's selection reads these).

Both backends serve causal decoder self-attention only: no attention sinks, sliding
windows, multimodal prefix masks or context parallelism, and both take the step's
token counts from host copies (so CPU and device query lengths must agree).
"""

from __future__ import annotations

from vllm.v1.attention.backend import AttentionType


class DecoderOnlyCapabilities:
    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER

    @classmethod
    def supports_sink(cls) -> bool:
        return False

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return False

    @classmethod
    def supports_mm_prefix(cls) -> bool:
        return False

    @classmethod
    def supports_pcp(cls) -> bool:
        return False

    @classmethod
    def supports_dcp(cls) -> bool:
        return False

    @classmethod
    def supports_device_cpu_query_lens_mismatch(cls) -> bool:
        return False
