"""NPU parity for the SFA-side operators and the K3 op (skipped without an Ascend NPU).

Each torch_npu call (through the plugin's ``*_npu`` functions) against the plugin's
reference on the same bf16 inputs, at DeepSeek-V3.2's real widths (latent 512, rope 64,
indexer key 128), with the caches and weight formats the engine passes (separate
contiguous latent / rope / indexer-key caches; FRACTAL_NZ prolog weights). Prints the
max abs error measured.
"""

from __future__ import annotations

import pytest
import torch

from vllm_ascend_ext.ops.format import ACL_FORMAT_FRACTAL_NZ, format_cast_npu
from vllm_ascend_ext.ops.kv_rmsnorm_rope_cache import (
    kv_rmsnorm_rope_cache_npu,
    kv_rmsnorm_rope_cache_reference,
)
from vllm_ascend_ext.ops.lightning_indexer import lightning_indexer_npu, lightning_indexer_reference
from vllm_ascend_ext.ops.mla_prolog import mla_prolog_v3_npu, mla_prolog_v3_reference
from vllm_ascend_ext.ops.quant import (
    dynamic_quant_npu,
    dynamic_quant_reference,
    quant_matmul_npu,
    quant_matmul_reference,
)
from vllm_ascend_ext.ops.sparse_flash_attention import (
    sparse_flash_attention_npu,
    sparse_flash_attention_reference,
)
from vllm_ascend_ext.platform.probe import npu_present

pytestmark = [pytest.mark.npu,
              pytest.mark.skipif(not npu_present(), reason="needs an Ascend NPU and torch_npu")]

BF = torch.bfloat16


def _npu(t):
    return t.to("npu") if isinstance(t, torch.Tensor) else t


def _batch(bs=128):
    q_lens, kv_lens = [1, 1, 3, 40], [300, 129, 200, 40]
    width = max(-(-n // bs) for n in kv_lens)
    nb = width * len(q_lens) + 2
    table = torch.randperm(nb)[: width * len(q_lens)].view(len(q_lens), width).to(torch.int32)
    cu = torch.tensor(q_lens).cumsum(0).to(torch.int32)
    return q_lens, torch.tensor(kv_lens, dtype=torch.int32), cu, table, nb


def test_kv_rmsnorm_rope_cache_matches_reference():
    torch.manual_seed(0)
    t, nb, bs = 37, 4, 128
    kv = torch.randn(t, 1, 1, 576).to(BF)
    gamma = torch.rand(512).to(BF) + 0.5
    ang = torch.rand(t, 1, 1, 32) * 6.28
    cos, sin = torch.cat([ang.cos()] * 2, -1).to(BF), torch.cat([ang.sin()] * 2, -1).to(BF)
    idx = torch.randperm(nb * bs)[:t].to(torch.int64)
    kr, kc = torch.zeros(nb, bs, 1, 64).to(BF), torch.zeros(nb, bs, 1, 512).to(BF)
    kv_rmsnorm_rope_cache_reference(kv, gamma, cos, sin, idx, kr, kc, epsilon=1e-6, cache_mode="PA")
    krn, kcn = _npu(torch.zeros_like(kr)), _npu(torch.zeros_like(kc))
    kv_rmsnorm_rope_cache_npu(*map(_npu, (kv, gamma, cos, sin, idx)), krn, kcn, epsilon=1e-6,
                              cache_mode="PA")
    err = max((krn.cpu() - kr).abs().max().item(), (kcn.cpu() - kc).abs().max().item())
    print(f"kv_rmsnorm_rope_cache: max abs err {err:.3e}")
    assert err < 3e-2


def test_lightning_indexer_selects_the_reference_scores():
    torch.manual_seed(1)
    q_lens, kv_lens, cu, table, nb = _batch()
    q = torch.randn(sum(q_lens), 64, 128).to(BF)
    key = torch.randn(nb, 128, 1, 128).to(BF)
    w = torch.randn(sum(q_lens), 64).to(BF)
    kw = dict(actual_seq_lengths_query=cu, actual_seq_lengths_key=kv_lens, block_table=table,
              layout_query="TND", layout_key="PA_BSND", sparse_count=64, sparse_mode=3)
    ref, _ = lightning_indexer_reference(q, key, w, **kw)
    got, _ = lightning_indexer_npu(*map(_npu, (q, key, w)), **{k: _npu(v) for k, v in kw.items()})
    got = got.cpu()
    agree = (got.sort(-1).values == ref.sort(-1).values).float().mean().item()
    print(f"lightning_indexer: {agree:.4f} of selected positions agree (bf16 near-ties differ)")
    assert agree > 0.97


def test_sparse_flash_attention_matches_reference():
    torch.manual_seed(2)
    q_lens, kv_lens, cu, table, nb = _batch()
    t, n = sum(q_lens), 16
    q, qr = torch.randn(t, n, 512).to(BF), torch.randn(t, n, 64).to(BF)
    kv, kr = torch.randn(nb, 128, 1, 512).to(BF), torch.randn(nb, 128, 1, 64).to(BF)
    idx = torch.full((t, 1, 64), -1, dtype=torch.int32)
    start = 0
    for lq, lk in zip(q_lens, kv_lens.tolist()):
        for i in range(lq):
            vis = lk - lq + i + 1
            idx[start + i, 0, : min(64, vis)] = torch.randperm(vis)[:64].to(torch.int32)
        start += lq
    kw = dict(block_table=table, actual_seq_lengths_query=cu, actual_seq_lengths_kv=kv_lens,
              sparse_block_size=1, layout_query="TND", layout_kv="PA_BSND", sparse_mode=3,
              attention_mode=2)
    ref, _, _ = sparse_flash_attention_reference(q, kv, kv, idx, 0.07, query_rope=qr, key_rope=kr, **kw)
    kvn = _npu(kv)
    got, _, _ = sparse_flash_attention_npu(_npu(q), kvn, kvn, _npu(idx), 0.07, query_rope=_npu(qr),
                                           key_rope=_npu(kr), **{k: _npu(v) for k, v in kw.items()})
    err = (got.cpu().float() - ref.float()).abs().max().item()
    print(f"sparse_flash_attention: max abs err {err:.3e}")
    assert err < 3e-2


def test_w8a8_quant_ops_match_reference():
    torch.manual_seed(3)
    x = torch.randn(33, 256).to(BF)
    yq, s = dynamic_quant_reference(x)
    yn, sn = dynamic_quant_npu(_npu(x))
    assert (yn.cpu().int() - yq.int()).abs().max().item() <= 1
    w = torch.randint(-127, 128, (256, 96), dtype=torch.int8)
    ws = torch.rand(96) * 1e-2
    ref = quant_matmul_reference(yq, w, ws, pertoken_scale=s, output_dtype=BF)
    got = quant_matmul_npu(_npu(yq), _npu(w), _npu(ws), pertoken_scale=_npu(s), output_dtype=BF)
    err = (got.cpu().float() - ref.float()).abs().max().item()
    print(f"dynamic_quant + quant_matmul: max abs err {err:.3e}")
    assert err < 5e-2 * ref.float().abs().max().item()


def test_k3_prolog_npu_kernel_matches_the_cpu_kernel():
    from vllm_ascend_ext.ops import _ext
    from vllm_ascend_ext.ops.mla_prolog_k3 import npu_mla_prolog_v3_k3

    if not _ext.load():
        pytest.fail("_C_ascend_ext is not built on this NPU host (README: csrc build)")
    torch.manual_seed(4)
    t, he, hcq, n, d, hckv = 9, 1024, 512, 8, 128, 512
    a = [torch.randn(t, he).to(BF), (torch.randn(he, hcq) / 32).to(BF),
         (torch.randn(hcq, n * d) / 22).to(BF), (torch.randn(n, d, hckv) / 11).to(BF),
         (torch.randn(he, hckv) / 32).to(BF), torch.ones(hcq).to(BF), torch.ones(hckv).to(BF)]
    idx = torch.randperm(256)[:t].to(torch.int64)
    c_cpu = torch.zeros(2, 128, 1, hckv).to(BF)
    q_cpu, _ = npu_mla_prolog_v3_k3(*a, c_cpu, cache_index=idx)
    c_npu = _npu(torch.zeros_like(c_cpu))
    q_npu, _ = npu_mla_prolog_v3_k3(*map(_npu, a), c_npu, cache_index=_npu(idx))
    err = max((q_npu.cpu().float() - q_cpu.float()).abs().max().item(),
              (c_npu.cpu().float() - c_cpu.float()).abs().max().item())
    print(f"npu_mla_prolog_v3_k3 (PrivateUse1 vs CPU kernel): max abs err {err:.3e}")
    assert err < 5e-2


def _quantize_columns(w):
    """Per-output-channel int8 of an [in, out] weight -> (int8, fp32 scale [1, out])."""
    scale = w.float().abs().amax(0, keepdim=True) / 127
    return torch.round(w.float() / scale).clamp(-128, 127).to(torch.int8), scale


@pytest.mark.parametrize("quantized", [False, True])
def test_mla_prolog_v3_with_nz_weights_matches_reference(quantized):
    """DeepSeek-V3.2 widths per TP-8 rank (16 heads): He 7168, Hcq 1536, D 128, Dr 64,
    Hckv 512; weights [in, out] cast to FRACTAL_NZ once, as ``SfaLayer`` does."""
    torch.manual_seed(4)
    t, he, hcq, n, d, dr, hckv, nb, bs = 6, 7168, 1536, 16, 128, 64, 512, 2, 128
    x = torch.randn(t, he).to(BF)
    w_dq, w_uq = (torch.randn(he, hcq) / he**0.5).to(BF), (torch.randn(hcq, n * (d + dr)) / hcq**0.5).to(BF)
    w_kv, w_uk = (torch.randn(he, hckv + dr) / he**0.5).to(BF), (torch.randn(n, d, hckv) / d**0.5).to(BF)
    ang = torch.rand(t, dr // 2) * 6.28
    cos, sin = torch.cat([ang.cos()] * 2, -1).to(BF), torch.cat([ang.sin()] * 2, -1).to(BF)
    idx = torch.randperm(nb * bs)[:t].to(torch.int64)
    kw = dict(cache_index=idx, rmsnorm_epsilon_cq=1e-6, rmsnorm_epsilon_ckv=1e-6,
              cache_mode="PA_BSND", query_norm_flag=True)
    weights = [w_dq, w_uq, w_kv]
    if quantized:
        token_x, sx = dynamic_quant_reference(x)
        (w_dq, s_dq), (w_uq, s_uq), (w_kv, s_kv) = map(_quantize_columns, weights)
        weights = [w_dq, w_uq, w_kv]
        kw.update(dequant_scale_x=sx.view(-1, 1), dequant_scale_w_dq=s_dq,
                  dequant_scale_w_uq_qr=s_uq, dequant_scale_w_dkv_kr=s_kv, weight_quant_mode=2)
    else:
        token_x = x
    gammas = torch.rand(hcq).to(BF) + 0.5, torch.rand(hckv).to(BF) + 0.5
    caches = torch.zeros(nb, bs, 1, hckv).to(BF), torch.zeros(nb, bs, 1, dr).to(BF)
    ref = mla_prolog_v3_reference(token_x, weights[0], weights[1], w_uk, weights[2], *gammas, sin,
                                  cos, *caches, **kw)
    nz = [format_cast_npu(_npu(w), ACL_FORMAT_FRACTAL_NZ) for w in weights]
    caches_n = [_npu(torch.zeros_like(c)) for c in caches]
    got = mla_prolog_v3_npu(_npu(token_x), nz[0], nz[1], _npu(w_uk), nz[2],
                            *map(_npu, gammas), _npu(sin), _npu(cos), *caches_n,
                            **{k: _npu(v) for k, v in kw.items()})
    for name, g, r in (("query", got[0], ref[0]), ("query_rope", got[1], ref[1]),
                       ("kv_cache", caches_n[0], caches[0]), ("kr_cache", caches_n[1], caches[1])):
        err = (g.cpu().float() - r.float()).abs().max().item()
        print(f"npu_mla_prolog_v3 ({'W8A8' if quantized else 'bf16'}, NZ weights) {name}: "
              f"max abs err {err:.3e}")
        assert err < 5e-2 * max(1.0, r.float().abs().max().item())
