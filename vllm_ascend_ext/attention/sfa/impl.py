"""Per-layer forward of the SFA backend.

    preprocess (native chain | npu_mla_prolog_v3)  -> latent query, rope query, c^Q;
                                                      latent + rope written to the cache
    indexer K stage (one wk_weights_proj GEMM)     -> indexer key written, weights tail
    indexer top-k stage                            -> npu_lightning_indexer
    npu_sparse_flash_attention                     -> latent output
    per-head W_UV                                  -> output [T, N * Dv]

Everything per step (slots, lengths, block table, cos/sin) comes from the metadata.
"""

from __future__ import annotations

import torch
from torch.profiler import record_function

from vllm_ascend_ext.attention.sfa import indexer
from vllm_ascend_ext.attention.sfa.layout import SfaRow
from vllm_ascend_ext.attention.sfa.metadata import AscendSFAMetadata
from vllm_ascend_ext.ops.kv_rmsnorm_rope_cache import npu_kv_rmsnorm_rope_cache
from vllm_ascend_ext.ops.mla_prolog import npu_mla_prolog_v3
from vllm_ascend_ext.ops.norm import npu_rms_norm
from vllm_ascend_ext.ops.quant import npu_dynamic_quant
from vllm_ascend_ext.ops.rope import npu_interleave_rope
from vllm_ascend_ext.ops.sparse_flash_attention import npu_sparse_flash_attention
from vllm_ascend_ext.quantization.w8a8_dynamic import apply_prequantized, is_w8a8


class AscendSFAImpl:
    def __init__(self, *, num_heads: int, qk_nope_head_dim: int, qk_rope_head_dim: int,
                 v_head_dim: int, row: SfaRow, scale: float, index_n_heads: int,
                 index_topk: int, indexer_rope_neox: bool, rms_eps: float,
                 k_norm_eps: float = 1e-6) -> None:
        self.num_heads = num_heads
        self.d_nope = qk_nope_head_dim
        self.d_rope = qk_rope_head_dim
        self.d_v = v_head_dim
        self.row = row
        self.scale = float(scale)
        self.index_n_heads = index_n_heads
        self.index_topk = index_topk
        self.indexer_rope_neox = indexer_rope_neox
        self.rms_eps = rms_eps
        self.k_norm_eps = k_norm_eps

    # -- preprocessing -------------------------------------------------------
    def _native(self, attn, w, x, meta, latent, rope):
        t, n = x.shape[0], self.num_heads
        cos4, sin4 = meta.cos.view(t, 1, 1, -1), meta.sin.view(t, 1, 1, -1)
        q_c, _ = npu_rms_norm(attn.q_a_proj(x)[0], attn.q_a_layernorm.weight, self.rms_eps)
        q = attn.q_b_proj(q_c)[0].view(t, n, self.d_nope + self.d_rope)
        q_nope, q_pe = q.split([self.d_nope, self.d_rope], dim=-1)
        ql_nope = torch.bmm(q_nope.transpose(0, 1), w.w_uk).transpose(0, 1)     # [T, N, Hckv]
        q_pe = npu_interleave_rope(q_pe.unsqueeze(2), cos4, sin4).squeeze(2)
        kv = attn.kv_a_proj_with_mqa(x)[0]
        npu_kv_rmsnorm_rope_cache(kv.view(t, 1, 1, -1), attn.kv_a_layernorm.weight, cos4, sin4,
                                  meta.slot_indices, rope, latent, epsilon=self.rms_eps,
                                  cache_mode="PA")
        return ql_nope, q_pe, q_c, None

    def _prolog(self, attn, w, x, meta, latent, rope):
        p = w.prolog
        kw = dict(cache_index=meta.slot_indices, rmsnorm_epsilon_cq=self.rms_eps,
                  rmsnorm_epsilon_ckv=self.rms_eps, cache_mode="PA_BSND", query_norm_flag=True)
        token_x = x
        if p.quantized:
            token_x, sx = npu_dynamic_quant(x)
            kw.update(dequant_scale_x=sx.view(-1, 1), dequant_scale_w_dq=p.scale_dq,
                      dequant_scale_w_uq_qr=p.scale_uq_qr, dequant_scale_w_dkv_kr=p.scale_dkv_kr,
                      weight_quant_mode=2)
        ql_nope, q_pe, _, q_c, q_c_scale = npu_mla_prolog_v3(
            token_x, p.w_dq, p.w_uq_qr, w.w_uk, p.w_dkv_kr, attn.q_a_layernorm.weight,
            attn.kv_a_layernorm.weight, meta.sin, meta.cos, latent, rope, **kw)
        return ql_nope, q_pe, q_c, q_c_scale

    # -- forward ---------------------------------------------------------------
    def forward(self, layer, hidden_states: torch.Tensor, output: torch.Tensor,
                kv_cache: torch.Tensor, meta: AscendSFAMetadata | None) -> None:
        if meta is None:          # profiling / dummy run without metadata
            output.zero_()
            return
        attn, w = layer.owner, layer.weights
        t = meta.num_actual_tokens
        x = hidden_states[:t]
        latent, rope, index_key = self.row.views(kv_cache)
        pre, route = (self._prolog, "prolog") if w.prolog else (self._native, "native")
        with record_function(f"ascend_ext.sfa.preprocess.{route}"):
            ql_nope, q_pe, q_c, q_c_scale = pre(attn, w, x, meta, latent, rope)
        with record_function("ascend_ext.sfa.indexer"):
            ix = attn.indexer
            key_rows = self.row.rows(kv_cache).view(-1, self.row.width)[:, -self.row.index_key:]
            tail = indexer.k_stage(ix, x, meta.cos, meta.sin, key_rows, meta.slot_indices,
                                   index_head_dim=self.row.index_key,
                                   neox=self.indexer_rope_neox, eps=self.k_norm_eps)

            def wq_b(qc):
                if q_c_scale is None:
                    return ix.wq_b(qc)[0]
                if is_w8a8(ix.wq_b):
                    return apply_prequantized(ix.wq_b, qc, q_c_scale, x.dtype)
                return ix.wq_b((qc.float() * q_c_scale).to(x.dtype))[0]

            topk = indexer.topk_stage(ix, x, q_c, tail, meta.cos, meta.sin, index_key, meta,
                                      n_heads=self.index_n_heads,
                                      index_head_dim=self.row.index_key, topk=self.index_topk,
                                      neox=self.indexer_rope_neox, wq_b_apply=wq_b)
        with record_function("ascend_ext.sfa.attention"):
            out, _, _ = npu_sparse_flash_attention(
                ql_nope, latent, latent, topk, self.scale, block_table=meta.block_table,
                actual_seq_lengths_query=meta.cu_seqlens_q, actual_seq_lengths_kv=meta.seq_lens,
                query_rope=q_pe, key_rope=rope, sparse_block_size=1, layout_query="TND",
                layout_kv="PA_BSND", sparse_mode=3, attention_mode=2)
            o = torch.bmm(out.transpose(0, 1), w.w_uv)                           # [N, T, Dv]
            output[:t].view(t, self.num_heads, self.d_v).copy_(o.transpose(0, 1))

