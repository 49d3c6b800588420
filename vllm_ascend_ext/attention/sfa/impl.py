"""Per-layer forward of the SFA backend.

    preprocess (native chain | npu_mla_prolog_v3)  -> latent query, rope query, c^Q;
                                                      latent + rope key written to their caches
    indexer K stage (one wk_weights_proj GEMM)     -> indexer key written, weights tail
    indexer top-k stage                            -> npu_lightning_indexer
    npu_sparse_flash_attention                     -> latent output
    per-head W_UV                                  -> output [T, N * Dv]

The layer hands in what it owns: its projections (``SfaProjections``), the weights
derived from them after loading (``SfaWeights``) and its three paged caches
(``SfaCaches``). Everything per step (slots, lengths, block table, cos/sin) comes from
the metadata.
"""

from __future__ import annotations

import torch

from vllm_ascend_ext.attention.sfa import indexer
from vllm_ascend_ext.attention.sfa.caches import SfaCaches
from vllm_ascend_ext.attention.sfa.metadata import AscendSFAMetadata
from vllm_ascend_ext.attention.sfa.projections import SfaProjections
from vllm_ascend_ext.attention.sfa.weights import SfaWeights
from vllm_ascend_ext.attention.trace import trace_range
from vllm_ascend_ext.ops.kv_rmsnorm_rope_cache import npu_kv_rmsnorm_rope_cache
from vllm_ascend_ext.ops.mla_prolog import npu_mla_prolog_v3
from vllm_ascend_ext.ops.norm import npu_rms_norm
from vllm_ascend_ext.ops.quant import npu_dynamic_quant
from vllm_ascend_ext.ops.rope import npu_interleave_rope
from vllm_ascend_ext.ops.sparse_flash_attention import npu_sparse_flash_attention


class AscendSFAImpl:
    def __init__(self, *, num_heads: int, qk_nope_head_dim: int, qk_rope_head_dim: int,
                 v_head_dim: int, scale: float, indexer_spec: indexer.IndexerSpec,
                 rms_eps: float) -> None:
        self.num_heads = num_heads
        self.d_nope = qk_nope_head_dim
        self.d_rope = qk_rope_head_dim
        self.d_v = v_head_dim
        self.scale = float(scale)
        self.indexer = indexer_spec
        self.rms_eps = rms_eps

    # -- preprocessing -------------------------------------------------------
    def _native(self, p: SfaProjections, w: SfaWeights, x, meta, caches: SfaCaches):
        t, n = x.shape[0], self.num_heads
        cos4, sin4 = meta.cos.view(t, 1, 1, -1), meta.sin.view(t, 1, 1, -1)
        q_c, _ = npu_rms_norm(p.q_a_proj(x)[0], p.q_a_layernorm.weight, self.rms_eps)
        q = p.q_b_proj(q_c)[0].view(t, n, self.d_nope + self.d_rope)
        q_nope, q_pe = q.split([self.d_nope, self.d_rope], dim=-1)
        # [T, N, Hckv], contiguous (SFA takes no strided query): bmm writes through the
        # transposed view of a contiguous buffer.
        ql_nope = x.new_empty(t, n, w.w_uk.shape[-1])
        torch.bmm(q_nope.transpose(0, 1), w.w_uk, out=ql_nope.transpose(0, 1))
        q_pe = npu_interleave_rope(q_pe.unsqueeze(2), cos4, sin4).squeeze(2)
        kv = p.kv_a_proj_with_mqa(x)[0]
        npu_kv_rmsnorm_rope_cache(kv.view(t, 1, 1, -1), p.kv_a_layernorm.weight, cos4, sin4,
                                  meta.slot_indices, caches.rope, caches.latent,
                                  epsilon=self.rms_eps, cache_mode="PA")
        return ql_nope, q_pe, q_c, None

    def _prolog(self, p: SfaProjections, w: SfaWeights, x, meta, caches: SfaCaches):
        pw = w.prolog
        kw = dict(cache_index=meta.slot_indices, rmsnorm_epsilon_cq=self.rms_eps,
                  rmsnorm_epsilon_ckv=self.rms_eps, cache_mode="PA_BSND", query_norm_flag=True)
        token_x = x
        if pw.quantized:
            token_x, sx = npu_dynamic_quant(x)
            kw.update(dequant_scale_x=sx.view(-1, 1), dequant_scale_w_dq=pw.scale_dq,
                      dequant_scale_w_uq_qr=pw.scale_uq_qr, dequant_scale_w_dkv_kr=pw.scale_dkv_kr,
                      weight_quant_mode=2)
        ql_nope, q_pe, _, q_c, q_c_scale = npu_mla_prolog_v3(
            token_x, pw.w_dq, pw.w_uq_qr, w.w_uk, pw.w_dkv_kr, p.q_a_layernorm.weight,
            p.kv_a_layernorm.weight, meta.sin, meta.cos, caches.latent, caches.rope, **kw)
        # Unquantized, the scale output is an empty placeholder: c^Q is plain.
        return ql_nope, q_pe, q_c, q_c_scale if pw.quantized else None

    # -- forward ---------------------------------------------------------------
    def forward(self, p: SfaProjections, w: SfaWeights, hidden_states: torch.Tensor,
                output: torch.Tensor, caches: SfaCaches, meta: AscendSFAMetadata) -> None:
        t = meta.num_actual_tokens
        x = hidden_states[:t]
        pre, route = (self._prolog, "prolog") if w.prolog else (self._native, "native")
        with trace_range(f"ascend_ext.sfa.preprocess.{route}", x.device):
            ql_nope, q_pe, q_c, q_c_scale = pre(p, w, x, meta, caches)
        with trace_range("ascend_ext.sfa.indexer", x.device):
            tail = indexer.k_stage(self.indexer, p.indexer, x, meta, caches.index_key)
            q = p.indexer_query(q_c, q_c_scale, x.dtype)
            topk = indexer.topk_stage(self.indexer, p.indexer, x, q, tail, meta,
                                      caches.index_key)
        with trace_range("ascend_ext.sfa.attention", x.device):
            out, _, _ = npu_sparse_flash_attention(
                ql_nope, caches.latent, caches.latent, topk, self.scale,
                block_table=meta.block_table, actual_seq_lengths_query=meta.cu_seqlens_q,
                actual_seq_lengths_kv=meta.seq_lens, query_rope=q_pe, key_rope=caches.rope,
                sparse_block_size=1, layout_query="TND", layout_kv="PA_BSND", sparse_mode=3,
                attention_mode=2)
            o = torch.bmm(out.transpose(0, 1), w.w_uv)                           # [N, T, Dv]
            output[:t].view(t, self.num_heads, self.d_v).copy_(o.transpose(0, 1))
