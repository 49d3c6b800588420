"""Each NPU operator the plugin calls, against its reference on the same inputs.

Every case builds its inputs on the CPU, runs the plugin's reference there and the
plugin's ``*_npu`` call site on ``_npu(...)`` copies, and returns what it measured. The
inputs are what the engine passes: vLLM's per-layer ``[num_blocks, KV_N, block_size,
2*D]`` pages seen as contiguous K/V plane runs (``attention/kv_layout.py``), SFA's
separate latent / rope / indexer-key caches, FRACTAL_NZ prolog weights, bf16.

Used by ``tests/npu`` (the parity suite the nightly runs first, parametrized; skipped
without an NPU), by its dry run on a CPU (``tests/ut/tools/test_npu_parity_dry_run.py``:
``_npu`` is the identity and contract mode stands in for torch_npu), and by
``doctor --smoke`` on an NPU host (``SMOKE``: one case per operator).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import torch

from vllm_ascend_ext.attention.kv_layout import plane_block_table, plane_slots, plane_views
from vllm_ascend_ext.ops.fia import causal_mask_2048, fia_npu, fia_reference
from vllm_ascend_ext.ops.format import ACL_FORMAT_FRACTAL_NZ, format_cast_npu
from vllm_ascend_ext.ops.grouped_matmul import (
    DTYPE_ENUM,
    grouped_matmul_npu,
    grouped_matmul_reference,
    swiglu_npu,
    swiglu_reference,
)
from vllm_ascend_ext.ops.kv_cache import scatter_pa_kv_cache_npu, scatter_pa_kv_cache_reference
from vllm_ascend_ext.ops.kv_rmsnorm_rope_cache import (
    kv_rmsnorm_rope_cache_npu,
    kv_rmsnorm_rope_cache_reference,
)
from vllm_ascend_ext.ops.lightning_indexer import lightning_indexer_npu, lightning_indexer_reference
from vllm_ascend_ext.ops.mla_prolog import mla_prolog_v3_npu, mla_prolog_v3_reference
from vllm_ascend_ext.ops.moe_dispatch import (
    init_routing_v2_npu,
    init_routing_v2_reference,
    token_unpermute_npu,
    token_unpermute_reference,
)
from vllm_ascend_ext.ops.moe_gating import (
    gating_top_k_npu,
    gating_top_k_reference,
    gating_top_k_softmax_npu,
    gating_top_k_softmax_reference,
)
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
from vllm_ascend_ext.tools import npu_parity_layers as layers

BF = torch.bfloat16


@dataclass(frozen=True)
class Measured:
    what: str
    value: float
    bound: float
    at_least: bool = False   # value must be >= bound (agreement), else <= bound (error)

    @property
    def ok(self) -> bool:
        return self.value >= self.bound if self.at_least else self.value <= self.bound

    def __str__(self) -> str:
        rel = ">=" if self.at_least else "<="
        return f"{self.what}: {self.value:.3e} (bound {rel} {self.bound:.1e})"


def _npu(t):
    return t.to("npu") if isinstance(t, torch.Tensor) else t


def _err(got, ref) -> float:
    return (got.cpu().float() - ref.float()).abs().max().item()


def _engine_cache(nb, nkv, bs, d, dtype, pad_planes=0):
    """A per-layer cache as vLLM allocates it (pages padded by ``pad_planes`` planes)."""
    plane = bs * nkv * d
    raw = torch.randn(nb * (2 + pad_planes) * plane).to(dtype)
    return raw.as_strided((nb, nkv, bs, 2 * d), ((2 + pad_planes) * plane, bs * 2 * d, 2 * d, 1))


def fia(d=128, gqa=2, bs=128, pad=0) -> list[Measured]:
    """Decodes, a chunk on a cached prefix and a prefill, causal, paged."""
    torch.manual_seed(0)
    nkv, dtype = 2, BF
    nq = nkv * gqa
    q_lens, kv_lens = [1, 1, 4, 37], [100, 300, 260, 37]
    width = max(-(-L // bs) for L in kv_lens)
    nb = len(q_lens) * width + 2  # every table entry a distinct block, two spare
    cache = _engine_cache(nb, nkv, bs, d, dtype, pad)
    blocks = torch.randperm(nb)[: len(q_lens) * width].view(len(q_lens), width)
    q = torch.randn(sum(q_lens), nq, d).to(dtype)
    kw = dict(atten_mask=causal_mask_2048(), actual_seq_lengths=list(itertools.accumulate(q_lens)),
              actual_seq_lengths_kv=kv_lens, num_heads=nq, num_key_value_heads=nkv,
              scale=d**-0.5, input_layout="TND", sparse_mode=3, block_size=bs)
    kc, vc, factor = plane_views(cache)
    table = plane_block_table(blocks, factor)
    ref, _ = fia_reference(q, kc.flatten(2), vc.flatten(2), block_table=table, **kw)
    kn, vn, _ = plane_views(_npu(cache))
    kw["atten_mask"] = _npu(kw["atten_mask"])
    got, _ = fia_npu(_npu(q), kn.flatten(2), vn.flatten(2), block_table=_npu(table), **kw)
    return [Measured(f"npu_fused_infer_attention_score d={d} gqa={gqa} bs={bs} pad={pad} "
                     "max abs err", _err(got, ref), 2e-2)]


def scatter_pa_kv_cache() -> list[Measured]:
    torch.manual_seed(0)
    nb, bs, nkv, d, t = 8, 128, 2, 128, 50
    key, value = torch.randn(t, nkv, d).half(), torch.randn(t, nkv, d).half()
    cache = torch.zeros(nb, nkv, bs, 2 * d).half()  # the engine's per-layer page layout
    on_npu = _npu(cache.clone())
    kc, vc, factor = plane_views(cache)
    slots = plane_slots(torch.randperm(nb * bs)[:t], bs, factor)
    scatter_pa_kv_cache_reference(key, value, kc, vc, slots, cache_mode="Norm")
    kn, vn, _ = plane_views(on_npu)
    scatter_pa_kv_cache_npu(_npu(key), _npu(value), kn, vn, _npu(slots), cache_mode="Norm")
    return [Measured("npu_scatter_pa_kv_cache (Norm) max abs err", _err(on_npu, cache), 0.0)]


def kv_rmsnorm_rope_cache() -> list[Measured]:
    torch.manual_seed(0)
    t, nb, bs = 37, 4, 128
    kv = torch.randn(t, 1, 1, 576).to(BF)
    gamma = torch.rand(512).to(BF) + 0.5
    ang = torch.rand(t, 1, 1, 32) * 6.28
    cos, sin = torch.cat([ang.cos()] * 2, -1).to(BF), torch.cat([ang.sin()] * 2, -1).to(BF)
    idx = torch.randperm(nb * bs)[:t].to(torch.int64)
    kr, kc = torch.zeros(nb, bs, 1, 64).to(BF), torch.zeros(nb, bs, 1, 512).to(BF)
    krn, kcn = _npu(torch.zeros_like(kr)), _npu(torch.zeros_like(kc))
    kv_rmsnorm_rope_cache_reference(kv, gamma, cos, sin, idx, kr, kc, epsilon=1e-6, cache_mode="PA")
    kv_rmsnorm_rope_cache_npu(*map(_npu, (kv, gamma, cos, sin, idx)), krn, kcn, epsilon=1e-6,
                              cache_mode="PA")
    return [Measured("npu_kv_rmsnorm_rope_cache max abs err",
                     max(_err(krn, kr), _err(kcn, kc)), 3e-2)]


def _batch(bs=128):
    q_lens, kv_lens = [1, 1, 3, 40], [300, 129, 200, 40]
    width = max(-(-n // bs) for n in kv_lens)
    nb = width * len(q_lens) + 2
    table = torch.randperm(nb)[: width * len(q_lens)].view(len(q_lens), width).to(torch.int32)
    cu = torch.tensor(q_lens).cumsum(0).to(torch.int32)
    return q_lens, torch.tensor(kv_lens, dtype=torch.int32), cu, table, nb


def lightning_indexer() -> list[Measured]:
    torch.manual_seed(1)
    q_lens, kv_lens, cu, table, nb = _batch()
    q = torch.randn(sum(q_lens), 64, 128).to(BF)
    key = torch.randn(nb, 128, 1, 128).to(BF)
    w = torch.randn(sum(q_lens), 64).to(BF)
    kw = dict(actual_seq_lengths_query=cu, actual_seq_lengths_key=kv_lens, block_table=table,
              layout_query="TND", layout_key="PA_BSND", sparse_count=64, sparse_mode=3)
    ref, _ = lightning_indexer_reference(q, key, w, **kw)
    got, _ = lightning_indexer_npu(*map(_npu, (q, key, w)), **{k: _npu(v) for k, v in kw.items()})
    agree = (got.cpu().sort(-1).values == ref.sort(-1).values).float().mean().item()
    # bf16 near-ties may select different positions
    return [Measured("npu_lightning_indexer selected positions agreeing", agree, 0.97, True)]


def sparse_flash_attention() -> list[Measured]:
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
    ref, _, _ = sparse_flash_attention_reference(q, kv, kv, idx, 0.07, query_rope=qr,
                                                 key_rope=kr, **kw)
    kvn = _npu(kv)
    got, _, _ = sparse_flash_attention_npu(_npu(q), kvn, kvn, _npu(idx), 0.07,
                                           query_rope=_npu(qr), key_rope=_npu(kr),
                                           **{k: _npu(v) for k, v in kw.items()})
    return [Measured("npu_sparse_flash_attention max abs err", _err(got, ref), 3e-2)]


def w8a8_quant_ops() -> list[Measured]:
    torch.manual_seed(3)
    x = torch.randn(33, 256).to(BF)
    yq, s = dynamic_quant_reference(x)
    yn, _ = dynamic_quant_npu(_npu(x))
    w = torch.randint(-127, 128, (256, 96), dtype=torch.int8)
    ws = torch.rand(96) * 1e-2
    ref = quant_matmul_reference(yq, w, ws, pertoken_scale=s, output_dtype=BF)
    got = quant_matmul_npu(_npu(yq), _npu(w), _npu(ws), pertoken_scale=_npu(s), output_dtype=BF)
    return [Measured("npu_dynamic_quant max int8 difference", _err(yn.int(), yq.int()), 1.0),
            Measured("npu_quant_matmul max abs err", _err(got, ref),
                     5e-2 * ref.float().abs().max().item())]


def k3_prolog() -> list[Measured]:
    """The plugin's own op (``_C_ascend_ext``): PrivateUse1 kernel vs its CPU kernel."""
    from vllm_ascend_ext.ops import _ext
    from vllm_ascend_ext.ops.mla_prolog_k3 import npu_mla_prolog_v3_k3

    if not _ext.load():
        raise RuntimeError("_C_ascend_ext is not built here (docs/operators.md: the op library)")
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
    return [Measured("npu_mla_prolog_v3_k3 (PrivateUse1 vs CPU kernel) max abs err",
                     max(_err(q_npu, q_cpu), _err(c_npu, c_cpu)), 5e-2)]


def _quantize_columns(w):
    """Per-output-channel int8 of an [in, out] weight -> (int8, fp32 scale [1, out])."""
    scale = w.float().abs().amax(0, keepdim=True) / 127
    return torch.round(w.float() / scale).clamp(-128, 127).to(torch.int8), scale


def mla_prolog_v3(quantized: bool = False) -> list[Measured]:
    """DeepSeek-V3.2 widths per TP-8 rank (16 heads): He 7168, Hcq 1536, D 128, Dr 64,
    Hckv 512; weights [in, out] cast to FRACTAL_NZ once, as ``SfaLayer`` does."""
    torch.manual_seed(4)
    t, he, hcq, n, d, dr, hckv, nb, bs = 6, 7168, 1536, 16, 128, 64, 512, 2, 128
    x = torch.randn(t, he).to(BF)
    w_dq = (torch.randn(he, hcq) / he**0.5).to(BF)
    w_uq = (torch.randn(hcq, n * (d + dr)) / hcq**0.5).to(BF)
    w_kv = (torch.randn(he, hckv + dr) / he**0.5).to(BF)
    w_uk = (torch.randn(n, d, hckv) / d**0.5).to(BF)
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
    caches_n = [_npu(torch.zeros_like(c)) for c in caches]
    ref = mla_prolog_v3_reference(token_x, weights[0], weights[1], w_uk, weights[2], *gammas,
                                  sin, cos, *caches, **kw)
    nz = [format_cast_npu(_npu(w), ACL_FORMAT_FRACTAL_NZ) for w in weights]
    got = mla_prolog_v3_npu(_npu(token_x), nz[0], nz[1], _npu(w_uk), nz[2],
                            *map(_npu, gammas), _npu(sin), _npu(cos), *caches_n,
                            **{k: _npu(v) for k, v in kw.items()})
    label = "W8A8" if quantized else "bf16"
    return [Measured(f"npu_mla_prolog_v3 ({label}, NZ weights) {name} max abs err",
                     _err(g, r), 5e-2 * max(1.0, r.float().abs().max().item()))
            for name, g, r in (("query", got[0], ref[0]), ("query_rope", got[1], ref[1]),
                               ("kv_cache", caches_n[0], caches[0]),
                               ("kr_cache", caches_n[1], caches[1]))]


def _same_sets(got, ref) -> float:
    """Fraction of rows choosing the same experts (order-free: ties may order differently)."""
    got, ref = got.cpu().sort(-1).values, ref.sort(-1).values
    return (got == ref).all(-1).float().mean().item()


def moe_routing() -> list[Measured]:
    """DeepSeek-V3 routing (256 experts, 8 groups keep 4, top-8, sigmoid + bias, x2.5) and
    Qwen's softmax top-8 of 128, on fp32 router logits as the MoE method passes them."""
    torch.manual_seed(5)
    logits, bias = torch.randn(64, 256) * 2, torch.randn(256) * 0.1
    kw = dict(bias=bias, k_group=4, group_count=8, group_select_mode=1, renorm=0, norm_type=1,
              out_flag=False, routed_scaling_factor=2.5, eps=1e-20)
    y_ref, i_ref, _ = gating_top_k_reference(logits, 8, **kw)
    y, i, _ = gating_top_k_npu(_npu(logits), 8, **{**kw, "bias": _npu(bias)})
    sm = torch.randn(64, 128) * 2
    ys_ref, is_ref, rows_ref = gating_top_k_softmax_reference(sm, None, k=8)
    ys, is_, rows = gating_top_k_softmax_npu(_npu(sm), None, k=8)
    return [Measured("npu_moe_gating_top_k rows with the same experts", _same_sets(i, i_ref), 0.99,
                     at_least=True),
            Measured("npu_moe_gating_top_k weight-sum error",
                     _err(y.float().sum(-1), y_ref.sum(-1)), 1e-3),
            Measured("npu_moe_gating_top_k_softmax rows with the same experts",
                     _same_sets(is_, is_ref), 0.99, at_least=True),
            Measured("npu_moe_gating_top_k_softmax row_idx difference", _err(rows, rows_ref), 0.0)]


def moe_experts(quantized: bool = False) -> list[Measured]:
    """Dispatch, the two grouped matmuls with SwiGLU between (bf16, or int8 with per-channel
    x per-row scales), and the weighted combine: 48 tokens, top-8 of 64 experts, H 1024."""
    torch.manual_seed(6)
    tokens, k, experts, hidden, inter = 48, 8, 64, 1024, 256
    x = torch.randn(tokens, hidden).to(BF)
    ids = torch.stack([torch.randperm(experts)[:k] for _ in range(tokens)]).int()
    kw = dict(scale=None, offset=None, active_num=-1, expert_capacity=-1, expert_num=experts,
              drop_pad_mode=0, expert_tokens_num_type=1, expert_tokens_num_flag=True,
              quant_mode=-1, active_expert_range=(0, experts), row_idx_type=0, x_dtype=None)
    ex_ref, row_ref, cnt_ref, _ = init_routing_v2_reference(x, ids, **kw)
    ex, row, cnt, _ = init_routing_v2_npu(_npu(x), _npu(ids), **kw)
    gmm = dict(split_item=2, group_type=0, group_list_type=1)
    if quantized:
        xq, xs = dynamic_quant_reference(ex_ref)
        w = torch.randint(-127, 128, (experts, hidden, 2 * inter), dtype=torch.int8)
        ws = torch.rand(experts, 2 * inter) * 1e-3
        q = dict(gmm, scale=[ws], per_token_scale=[xs], output_dtype=DTYPE_ENUM[BF])
        h_ref = grouped_matmul_reference([xq], [w], group_list=cnt_ref, **q)[0]
        h = grouped_matmul_npu([_npu(xq)], [_npu(w)], group_list=_npu(cnt_ref),
                               **{**q, "scale": [_npu(ws)], "per_token_scale": [_npu(xs)]})[0]
    else:
        w = (torch.randn(experts, hidden, 2 * inter) / hidden**0.5).to(BF)
        h_ref = grouped_matmul_reference([ex_ref], [w], group_list=cnt_ref, **gmm)[0]
        h = grouped_matmul_npu([_npu(ex_ref)], [_npu(w)], group_list=_npu(cnt_ref), **gmm)[0]
    act_ref = swiglu_reference(h_ref)
    act = swiglu_npu(_npu(h_ref))
    probs = torch.rand(tokens, k)
    out_ref = token_unpermute_reference(act_ref, row_ref, probs=probs)
    out = token_unpermute_npu(_npu(act_ref), _npu(row_ref), probs=_npu(probs))
    scale = lambda t: t.float().abs().max().item()  # noqa: E731
    name = "npu_grouped_matmul (W8A8)" if quantized else "npu_grouped_matmul"
    return [Measured("npu_moe_init_routing_v2 rows/map/counts difference",
                     max(_err(ex, ex_ref), _err(row, row_ref), _err(cnt, cnt_ref)), 0.0),
            Measured(f"{name} max abs err", _err(h, h_ref), 1e-2 * scale(h_ref)),
            Measured("npu_swiglu max abs err", _err(act, act_ref), 1e-2 * scale(act_ref)),
            Measured("npu_moe_token_unpermute max abs err", _err(out, out_ref),
                     1e-2 * scale(out_ref))]


# One case per operator the plugin calls on an NPU (``doctor --smoke``).
SMOKE = (fia, scatter_pa_kv_cache, kv_rmsnorm_rope_cache, lightning_indexer,
         sparse_flash_attention, w8a8_quant_ops, functools.partial(mla_prolog_v3, False),
         functools.partial(mla_prolog_v3, True), k3_prolog, moe_routing,
         functools.partial(moe_experts, False), functools.partial(moe_experts, True),
         layers.rms_norm, layers.add_rms_norm, layers.gemma_rms_norm,
         *(functools.partial(layers.mrope, case) for case in layers.ROPE_CASES),
         layers.add_rms_norm_dynamic_quant, layers.moe_experts_w8a8_fused,
         layers.w8a8_mlp_activation)


def case_name(case) -> str:
    if isinstance(case, functools.partial):
        return f"{case.func.__name__}{list(case.args)}"
    return case.__name__


def run_smoke(cases=SMOKE) -> list[dict]:
    """Run each case; a case that raises is reported, not propagated."""
    out = []
    for case in cases:
        try:
            measured = case()
            out.append({"case": case_name(case), "ok": all(m.ok for m in measured),
                        "measured": [str(m) for m in measured]})
        except Exception as exc:  # noqa: BLE001 - a smoke reports every failure
            out.append({"case": case_name(case), "ok": False,
                        "error": f"{type(exc).__name__}: {exc}"})
    return out
