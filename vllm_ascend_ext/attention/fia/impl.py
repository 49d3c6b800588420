"""Per-layer forward of the FIA backend: write K/V, then one fused attention call per
span of the step (``AscendFIAMetadata.spans``: one span, or decode and prefill spans)."""

from __future__ import annotations

import torch
from vllm.v1.attention.backend import AttentionImpl, AttentionLayer, AttentionType

from vllm_ascend_ext.attention.fia.graph_tasks import fia_call
from vllm_ascend_ext.attention.fia.metadata import AscendFIAMetadata
from vllm_ascend_ext.attention.fia.split import Span
from vllm_ascend_ext.attention.kv_layout import plane_views
from vllm_ascend_ext.attention.trace import trace_range
from vllm_ascend_ext.ops.fia import causal_mask_2048
from vllm_ascend_ext.ops.kv_cache import npu_scatter_pa_kv_cache

# FIA sparse_mode 3: causal anchored bottom-right (chunk at the end of its sequence).
SPARSE_MODE_CAUSAL = 3


class AscendFIAImpl(AttentionImpl[AscendFIAMetadata]):
    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int | None = None,
        alibi_slopes: list[float] | None = None,
        sliding_window: int | None = None,
        kv_cache_dtype: str = "auto",
        logits_soft_cap: float | None = None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
        sinks: torch.Tensor | None = None,
    ) -> None:
        refused = {
            "alibi_slopes": alibi_slopes is not None,
            "sliding_window": sliding_window is not None,
            "logits_soft_cap": bool(logits_soft_cap),
            "sinks": sinks is not None,
            "attn_type": attn_type != AttentionType.DECODER,
            "kv_cache_dtype": kv_cache_dtype not in ("auto", "float16", "bfloat16"),
        }
        bad = [k for k, v in refused.items() if v]
        if bad:
            raise NotImplementedError(
                f"ascend_ext FIA backend cannot compute {', '.join(bad)} "
                f"(attn_type={attn_type}, kv_cache_dtype={kv_cache_dtype}); "
                "refusing rather than computing it wrongly"
            )
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.attn_type = attn_type
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self._mask: torch.Tensor | None = None

    def _causal_mask(self, device: torch.device) -> torch.Tensor:
        if self._mask is None or self._mask.device != device:
            self._mask = causal_mask_2048(device)
        return self._mask

    def forward(
        self,
        layer: AttentionLayer,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: AscendFIAMetadata | None,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("ascend_ext FIA backend: fused output quantization")
        if attn_metadata is None:  # profiling / warm-up run
            return output
        md = attn_metadata
        n = md.num_actual_tokens
        key_cache, value_cache, _ = plane_views(kv_cache, md.plane_factor)
        if self.kv_sharing_target_layer_name is None:
            # The writer takes no strided input: a split of the fused QKV projection is
            # strided (copied here, as vllm-ascend does); a normed/rotated key is not.
            npu_scatter_pa_kv_cache(
                key[:n].view(n, self.num_kv_heads, self.head_size).contiguous(),
                value[:n].view(n, self.num_kv_heads, self.head_size).contiguous(),
                key_cache, value_cache, md.slot_indices, cache_mode="Norm")
        if md.spans:
            # FIA takes no strided query either ("不支持非连续的Tensor"): eager, a query that
            # RoPE rotated in place inside the fused QKV output is a strided split of it
            # (compiled, it arrives contiguous and nothing is copied).
            query = query.contiguous()
        for span in md.spans:
            with trace_range(f"ascend_ext.fia_mixed.{span.name}", query.device):
                rows = output[span.rows].view(-1, self.num_heads, self.head_size)
                attn = self._fia(query, key_cache, value_cache, md, span, rows)
                if attn.data_ptr() != rows.data_ptr():   # a graph task wrote in place
                    rows.copy_(attn)
        return output

    def _fia(self, query, key_cache, value_cache, md: AscendFIAMetadata,
             span: Span, rows: torch.Tensor | None = None) -> torch.Tensor:
        """One FIA call over the span's tokens and requests; it reads the whole paged
        cache. In a decode graph being captured, a graph task (graph_tasks.py)."""
        t = span.tok1 - span.tok0
        nb, bs = key_cache.shape[:2]
        args = (query[span.rows].view(t, self.num_heads, self.head_size),
                key_cache.view(nb, bs, -1), value_cache.view(nb, bs, -1))
        kwargs = dict(
            atten_mask=self._causal_mask(query.device) if md.causal else None,
            block_table=md.block_table[span.reqs],
            num_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            scale=self.scale,
            input_layout="TND",
            sparse_mode=SPARSE_MODE_CAUSAL if md.causal else 0,
            block_size=bs,
        )
        return fia_call(md.graph_tasks, args, kwargs, span.host_lists,
                        default_key=query.shape[0], out=rows)
