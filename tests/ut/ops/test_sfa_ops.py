"""SFA-side operator references against independent math (explicit loops, float64).

Covers npu_interleave_rope, npu_rms_norm, npu_dynamic_quant, npu_quant_matmul,
npu_kv_rmsnorm_rope_cache, npu_mla_prolog_v3 (bf16-style and W8A8),
npu_lightning_indexer (incl. fewer visible keys than top-k) and
npu_sparse_flash_attention (dense attention restricted to the selected keys).
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from tests.ut.dense import dense_attention, write_paged
from vllm_ascend_ext.ops.kv_rmsnorm_rope_cache import npu_kv_rmsnorm_rope_cache
from vllm_ascend_ext.ops.lightning_indexer import npu_lightning_indexer
from vllm_ascend_ext.ops.mla_prolog import npu_mla_prolog_v3
from vllm_ascend_ext.ops.norm import npu_rms_norm
from vllm_ascend_ext.ops.quant import npu_dynamic_quant, npu_quant_matmul
from vllm_ascend_ext.ops.rope import npu_interleave_rope
from vllm_ascend_ext.ops.sparse_flash_attention import npu_sparse_flash_attention


def _cos_sin(positions, dr, base=10000.0):
    """Half-duplicated cos/sin (cat([freqs, freqs])) for each position: [T, dr]."""
    inv = [base ** (-2 * k / dr) for k in range(dr // 2)]
    cos = torch.tensor([[math.cos(p * f) for f in inv] * 2 for p in positions])
    sin = torch.tensor([[math.sin(p * f) for f in inv] * 2 for p in positions])
    return cos, sin


def _gptj_rope_halfsplit(x, pos, base=10000.0):
    """Independent: rotate pairs (x2k, x2k+1) by pos*freq_k, emit [evens..., odds...]."""
    d = x.shape[-1]
    out = torch.empty(d, dtype=torch.float64)
    for k in range(d // 2):
        a = pos * base ** (-2 * k / d)
        e, o = float(x[2 * k]), float(x[2 * k + 1])
        out[k] = e * math.cos(a) - o * math.sin(a)
        out[d // 2 + k] = o * math.cos(a) + e * math.sin(a)
    return out


def _rms64(v, g, eps):
    v = v.double()
    return v / math.sqrt(float((v * v).mean()) + eps) * g.double()


# ------------------------------------------------------------------ helpers ops
def test_interleave_rope_is_gptj_rope_in_halfsplit_order_and_keeps_dot_products():
    torch.manual_seed(0)
    pos = [0, 3, 17]
    x = torch.randn(1, 2, 3, 64)
    cos, sin = _cos_sin(pos, 64)
    y = npu_interleave_rope(x, cos[None, None].expand(1, 1, 3, 64).contiguous(),
                            sin[None, None].expand(1, 1, 3, 64).contiguous())
    for h in range(2):
        for s, p in enumerate(pos):
            torch.testing.assert_close(y[0, h, s].double(), _gptj_rope_halfsplit(x[0, h, s], p),
                                       rtol=1e-5, atol=1e-5)
    # the permutation is shared: relative-position dot products survive
    q, k = y[0, 0, 1], y[0, 1, 2]
    assert q.dot(k).item() != pytest.approx(x[0, 0, 1].dot(x[0, 1, 2]).item(), abs=1e-3)


def test_rms_norm_matches_explicit_formula_and_returns_rstd():
    torch.manual_seed(1)
    x = torch.randn(4, 3, 16, dtype=torch.bfloat16)
    g = torch.randn(16)
    y, rstd = npu_rms_norm(x, g, 1e-6)
    assert y.dtype == torch.bfloat16 and rstd.shape == (4, 3, 1) and rstd.dtype == torch.float32
    for i in range(4):
        for j in range(3):
            v = x[i, j].double()
            r = 1 / math.sqrt(float((v * v).mean()) + 1e-6)
            assert rstd[i, j, 0].item() == pytest.approx(r, rel=1e-5)
            torch.testing.assert_close(y[i, j].double(), (v * r * g.double()).bfloat16().double())


def test_dynamic_quant_per_token_symmetric_with_smooth_scales_and_zero_rows():
    x = torch.tensor([[1.0, -2.0, 0.5, 127.0 / 254.0 * 2.0], [0.0, 0.0, 0.0, 0.0]])
    smooth = torch.tensor([1.0, 0.5, 2.0, 1.0])
    y, scale = npu_dynamic_quant(x, smooth_scales=smooth)
    xs = [[1.0, -1.0, 1.0, 1.0], [0.0] * 4]
    assert scale[0].item() == pytest.approx(1.0 / 127)
    assert y[0].tolist() == [round(v * 127) for v in xs[0]]
    assert scale[1].item() == 0 and y[1].tolist() == [0, 0, 0, 0]
    # round half to even, as the goldens' torch.round
    y2, s2 = npu_dynamic_quant(torch.tensor([[127.0, 2.5, 3.5, -0.5]]))
    assert s2.item() == 1.0 and y2[0].tolist() == [127, 2, 4, 0]


def test_quant_matmul_int32_accumulation_and_scales():
    g = torch.Generator().manual_seed(2)
    x1 = torch.randint(-128, 128, (3, 40), dtype=torch.int8, generator=g)
    x2 = torch.randint(-128, 128, (40, 5), dtype=torch.int8, generator=g)
    scale = torch.rand(5, generator=g) * 1e-3
    pts = torch.rand(3, generator=g)
    bias = torch.randn(5, generator=g)
    out = npu_quant_matmul(x1, x2, scale, pertoken_scale=pts, bias=bias,
                           output_dtype=torch.float32)
    for m in range(3):
        for n in range(5):
            acc = sum(int(x1[m, k]) * int(x2[k, n]) for k in range(40))
            want = acc * float(scale[n]) * float(pts[m]) + float(bias[n])
            assert out[m, n].item() == pytest.approx(want, rel=1e-5, abs=1e-5)
    acc32 = npu_quant_matmul(x1, x2, scale, output_dtype=torch.int32)
    assert acc32[0, 0].item() == sum(int(x1[0, k]) * int(x2[k, 0]) for k in range(40))
    sat = npu_quant_matmul(x1, x2, torch.tensor([1.0]))           # default int8, saturating
    assert sat.dtype == torch.int8 and sat.abs().max().item() in (127, 128)


# ------------------------------------------------------------ kv rmsnorm rope
def test_kv_rmsnorm_rope_cache_writes_int64_slots_through_strided_views():
    torch.manual_seed(3)
    t, dc, dr, bs, nb = 5, 16, 8, 4, 6
    kv = torch.randn(t, 1, 1, dc + dr)
    gamma = torch.randn(dc)
    pos = [4, 0, 9, 2, 7]
    cos, sin = _cos_sin(pos, dr)
    row = torch.full((nb, bs, 1, dc + dr + 3), 9.0)         # one row holds latent|rope|extra
    ckv_cache, k_cache = row[..., :dc], row[..., dc:dc + dr]
    slots = torch.tensor([5, -1, 0, 23, 12], dtype=torch.int64)
    _, _, k_out, y_out = npu_kv_rmsnorm_rope_cache(
        kv, gamma, cos.view(t, 1, 1, dr), sin.view(t, 1, 1, dr), slots, k_cache, ckv_cache,
        epsilon=1e-5, cache_mode="PA", is_output_kv=True)
    for i, (s, p) in enumerate(zip(slots.tolist(), pos)):
        want_c = _rms64(kv[i, 0, 0, :dc], gamma, 1e-5)
        base = kv[i, 0, 0, dc:].double()
        d = dr
        want_k = torch.tensor([0.0] * d, dtype=torch.float64)
        for k in range(d // 2):
            a = p * 10000.0 ** (-2 * k / d)
            e, o = float(base[2 * k]), float(base[2 * k + 1])
            want_k[k], want_k[d // 2 + k] = e * math.cos(a) - o * math.sin(a), o * math.cos(a) + e * math.sin(a)
        torch.testing.assert_close(y_out[i, 0, 0].double(), want_c, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(k_out[i, 0, 0].double(), want_k, rtol=1e-5, atol=1e-5)
        if s >= 0:
            torch.testing.assert_close(row[s // bs, s % bs, 0, :dc].double(), want_c, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(row[s // bs, s % bs, 0, dc:dc + dr].double(), want_k, rtol=1e-5, atol=1e-5)
    written = {5, 0, 23, 12}
    for s in range(nb * bs):
        assert (row[s // bs, s % bs, 0, dc + dr:] == 9.0).all()   # neighbour columns untouched
        if s not in written:
            assert (row[s // bs, s % bs, 0] == 9.0).all()


def test_kv_rmsnorm_rope_cache_rejects_int32_slots():
    kv = torch.randn(2, 1, 1, 24)
    c = torch.zeros(2, 4, 1, 16)
    r = torch.zeros(2, 4, 1, 8)
    with pytest.raises(ValueError, match="int64"):
        npu_kv_rmsnorm_rope_cache(kv, torch.ones(16), torch.ones(2, 1, 1, 8), torch.ones(2, 1, 1, 8),
                                  torch.tensor([0, 1], dtype=torch.int32), r, c, cache_mode="PA")


# ----------------------------------------------------------------- mla prolog
def _prolog_inputs(t=3, he=32, hcq=24, n=2, d=8, dr=8, hckv=16, seed=4):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g) / math.sqrt(s[0])  # noqa: E731
    return dict(x=torch.randn(t, he, generator=g), w_dq=r(he, hcq), w_uq_qr=r(hcq, n * (d + dr)),
                w_uk=r(n, d, hckv), w_dkv_kr=r(he, hckv + dr), g_cq=1 + 0.1 * torch.randn(hcq, generator=g),
                g_ckv=1 + 0.1 * torch.randn(hckv, generator=g)), (t, n, d, dr, hckv)


def _prolog_independent(inp, dims, pos, deq=None):
    """Loops over tokens and heads, float64; deq(name, matrix_product_fn) for W8A8."""
    t, n, d, dr, hckv = dims
    outs = []
    for i in range(t):
        x = inp["x"][i].double()
        cq = _rms64(x @ inp["w_dq"].double(), inp["g_cq"], 1e-5)
        q = (cq @ inp["w_uq_qr"].double()).view(n, d + dr)
        query = torch.stack([q[h, :d] @ inp["w_uk"][h].double() for h in range(n)])
        qrope = torch.stack([_gptj_rope_halfsplit(q[h, d:], pos[i]) for h in range(n)])
        kvkr = x @ inp["w_dkv_kr"].double()
        ckv = _rms64(kvkr[:hckv], inp["g_ckv"], 1e-5)
        kr = _gptj_rope_halfsplit(kvkr[hckv:], pos[i])
        outs.append((query, qrope, cq, ckv, kr))
    return outs


def test_mla_prolog_v3_unquantized_matches_independent_math_and_writes_caches():
    inp, dims = _prolog_inputs()
    t, n, d, dr, hckv = dims
    pos = [3, 11, 0]
    cos, sin = _cos_sin(pos, dr)
    kv_cache = torch.zeros(3, 4, 1, hckv)
    kr_cache = torch.zeros(3, 4, 1, dr)
    slots = torch.tensor([7, -1, 2], dtype=torch.int64)
    query, qrope, qscale, qnorm, _ = npu_mla_prolog_v3(
        inp["x"], inp["w_dq"], inp["w_uq_qr"], inp["w_uk"], inp["w_dkv_kr"], inp["g_cq"],
        inp["g_ckv"], sin, cos, kv_cache, kr_cache, cache_index=slots, query_norm_flag=True)
    assert qscale.shape == (0,) and qscale.dtype == torch.float32   # not produced: empty
    for i, (want_q, want_qr, want_cq, want_ckv, want_kr) in enumerate(_prolog_independent(inp, dims, pos)):
        torch.testing.assert_close(query[i].double(), want_q, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(qrope[i].double(), want_qr, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(qnorm[i].double(), want_cq, rtol=1e-4, atol=1e-4)
        s = int(slots[i])
        if s >= 0:
            torch.testing.assert_close(kv_cache[s // 4, s % 4, 0].double(), want_ckv, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(kr_cache[s // 4, s % 4, 0].double(), want_kr, rtol=1e-4, atol=1e-4)
    assert kv_cache.view(-1, hckv).abs().sum(-1).nonzero().flatten().tolist() == [2, 7]


def _prolog_bf16_points(inp, dims, cos, sin, kernel_points: bool):
    """Float64 math rounded to bf16 where the kernel rounds: c^Q and q_nope always; with
    ``kernel_points`` also x @ W_dq before its RmsNorm and q_pe before RoPE (what the
    kernel does, per op-plugin's golden). RoPE from the given cos/sin tables."""
    t, n, d, dr, hckv = dims
    b = lambda v: v.to(torch.bfloat16).double()  # noqa: E731
    keep = b if kernel_points else (lambda v: v)
    x = inp["x"].double()
    cq = b(torch.stack([_rms64(row, inp["g_cq"], 1e-5) for row in keep(x @ inp["w_dq"].double())]))
    q = (cq @ inp["w_uq_qr"].double()).view(t, n, d + dr)
    query = b(torch.einsum("tnd,ndc->tnc", b(q[..., :d]), inp["w_uk"].double()))
    pe, c, s_ = keep(q[..., d:]), cos.double()[:, None, :dr // 2], sin.double()[:, None, :dr // 2]
    ev, od = pe[..., 0::2], pe[..., 1::2]
    qrope = b(torch.cat([ev * c - od * s_, od * c + ev * s_], -1))
    return query, qrope


def test_mla_prolog_v3_bf16_rounds_where_the_kernel_rounds():
    inp, dims = _prolog_inputs(t=8, he=64, hcq=48, n=4, d=16, dr=16, hckv=32, seed=9)
    inp = {k: v.to(torch.bfloat16) for k, v in inp.items()}
    cos, sin = (v.to(torch.bfloat16) for v in _cos_sin([3, 11, 0, 5, 7, 2, 9, 1], 16))
    caches = torch.zeros(4, 16, 1, 32, dtype=torch.bfloat16), torch.zeros(4, 16, 1, 16, dtype=torch.bfloat16)
    query, qrope, *_ = npu_mla_prolog_v3(
        inp["x"], inp["w_dq"], inp["w_uq_qr"], inp["w_uk"], inp["w_dkv_kr"], inp["g_cq"],
        inp["g_ckv"], sin, cos, *caches, cache_index=torch.arange(8))
    kernel = _prolog_bf16_points(inp, dims, cos, sin, kernel_points=True)
    wider = _prolog_bf16_points(inp, dims, cos, sin, kernel_points=False)
    for got, want, other in zip((query, qrope), kernel, wider):
        same = (got.double() == want).double().mean().item()
        assert same >= 0.97, same                      # rounding ties aside, bit-equal
        # the test discriminates: keeping those two intermediates wider moves many elements
        assert (other != want).double().mean().item() >= 0.1


def _quantize_weight(w):
    """Per-output-channel symmetric int8 of an [in, out] weight -> (int8, scale [1,out])."""
    s = w.abs().amax(0, keepdim=True) / 127
    return torch.round(w / s).clamp(-128, 127).to(torch.int8), s


def test_mla_prolog_v3_w8a8_equals_dequantized_int_math():
    inp, dims = _prolog_inputs(seed=5)
    t, n, d, dr, hckv = dims
    pos = [1, 2, 40]
    cos, sin = _cos_sin(pos, dr)
    xq, sx = npu_dynamic_quant(inp["x"])
    wdq, sdq = _quantize_weight(inp["w_dq"])
    wuq, suq = _quantize_weight(inp["w_uq_qr"])
    wkv, skv = _quantize_weight(inp["w_dkv_kr"])
    kv_cache, kr_cache = torch.zeros(1, 4, 1, hckv), torch.zeros(1, 4, 1, dr)
    query, qrope, _, qnorm, qnorm_scale = npu_mla_prolog_v3(
        xq, wdq, wuq, inp["w_uk"], wkv, inp["g_cq"], inp["g_ckv"], sin, cos, kv_cache, kr_cache,
        cache_index=torch.arange(t, dtype=torch.int64), dequant_scale_x=sx.view(t, 1),
        dequant_scale_w_dq=sdq, dequant_scale_w_uq_qr=suq, dequant_scale_w_dkv_kr=skv,
        weight_quant_mode=2, query_norm_flag=True)
    assert qnorm.dtype == torch.int8 and qnorm_scale.shape == (t, 1)
    for i in range(t):
        xi = [int(v) for v in xq[i]]
        def mm(w, s, a, sa):  # explicit int dot products, then both scales
            return torch.tensor([sum(a[k] * int(w[k, o]) for k in range(len(a))) * float(s[0, o]) * sa
                                 for o in range(w.shape[1])], dtype=torch.float64)
        cq = _rms64(mm(wdq, sdq, xi, float(sx[i])), inp["g_cq"], 1e-5)
        cs = float(cq.abs().max()) / 127
        cqi = [int(torch.round(torch.tensor(v / cs))) for v in cq.tolist()]
        assert [int(v) for v in qnorm[i]] == cqi
        q = mm(wuq, suq, cqi, cs).view(n, d + dr)
        want = torch.stack([q[h, :d] @ inp["w_uk"][h].double() for h in range(n)])
        torch.testing.assert_close(query[i].double(), want, rtol=1e-4, atol=1e-4)
        kvkr = mm(wkv, skv, xi, float(sx[i]))
        torch.testing.assert_close(kv_cache[0, i, 0].double(), _rms64(kvkr[:hckv], inp["g_ckv"], 1e-5),
                                   rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(qrope[i, 0].double(), _gptj_rope_halfsplit(q[0, d:], pos[i]),
                                   rtol=1e-4, atol=1e-4)


def test_mla_prolog_v3_rejects_unemulated_modes_and_wrong_layouts():
    inp, dims = _prolog_inputs()
    t, n, d, dr, hckv = dims
    cos, sin = _cos_sin([0, 1, 2], dr)
    args = (inp["x"], inp["w_dq"], inp["w_uq_qr"], inp["w_uk"], inp["w_dkv_kr"], inp["g_cq"],
            inp["g_ckv"], sin, cos, torch.zeros(1, 4, 1, hckv), torch.zeros(1, 4, 1, dr))
    idx = torch.arange(3, dtype=torch.int64)
    with pytest.raises(NotImplementedError, match="weight_quant_mode 3"):
        npu_mla_prolog_v3(*args, cache_index=idx, weight_quant_mode=3)
    with pytest.raises(ValueError, match="weight_dq"):
        npu_mla_prolog_v3(inp["x"], inp["w_dq"].T.contiguous(), *args[2:], cache_index=idx)


# ------------------------------------------------------------ lightning indexer
def _explicit_topk(q, keys, w, lq, lk, k_sel, causal=True):
    """Loops: score(t, j) = sum_h w[t,h] * relu(q[t,h].key[j]); sorted descending, -1 padded."""
    out = []
    for i in range(lq):
        scored = []
        for j in range(lk):
            if causal and j > i + lk - lq:
                continue
            s = sum(float(w[i, h]) * max(0.0, float(q[i, h].double() @ keys[j].double()))
                    for h in range(q.shape[1]))
            scored.append((s, j))
        scored.sort(key=lambda p: -p[0])
        sel = [j for _, j in scored[:k_sel]]
        out.append(sel + [-1] * (k_sel - len(sel)))
    return out


@pytest.mark.parametrize("k_sel", [4, 9, 32])
def test_lightning_indexer_equals_explicit_topk_including_short_sequences(k_sel):
    torch.manual_seed(6)
    lens_q, lens_k = [1, 6, 3], [13, 6, 2]                 # decode, prefill, short extend (Lk < K)
    n, d, bs = 3, 16, 4
    keys = [torch.randn(lk, 1, d) for lk in lens_k]
    kc, _, table = write_paged(keys, keys, bs, 12, random.Random(0), torch.float32)
    q = torch.randn(sum(lens_q), n, d)
    w = torch.rand(sum(lens_q), n) + 0.1
    cu = torch.tensor([1, 7, 10], dtype=torch.int32)
    idx, values = npu_lightning_indexer(
        q, kc, w, actual_seq_lengths_query=cu, actual_seq_lengths_key=torch.tensor(lens_k, dtype=torch.int32),
        block_table=table, layout_query="TND", layout_key="PA_BSND", sparse_count=k_sel, sparse_mode=3)
    assert values.numel() == 0 and idx.dtype == torch.int32 and idx.shape == (10, 1, k_sel)
    start = 0
    for b, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        want = _explicit_topk(q[start:start + lq], keys[b][:, 0], w[start:start + lq], lq, lk, k_sel)
        assert idx[start:start + lq, 0].tolist() == want
        start += lq
    # fewer visible keys than K: row 0 of the prefill sees 1 key, the rest is -1
    assert idx[1, 0, 0].item() == 0 and (idx[1, 0, 1:] == -1).all()


def test_lightning_indexer_mode0_sees_all_keys():
    torch.manual_seed(7)
    keys = [torch.randn(5, 1, 8)]
    kc, _, table = write_paged(keys, keys, 4, 3, random.Random(1), torch.float32)
    q, w = torch.randn(2, 2, 8), torch.rand(2, 2)
    idx, _ = npu_lightning_indexer(q, kc, w, actual_seq_lengths_query=torch.tensor([2], dtype=torch.int32),
                                   actual_seq_lengths_key=torch.tensor([5], dtype=torch.int32),
                                   block_table=table, layout_query="TND", layout_key="PA_BSND",
                                   sparse_count=8, sparse_mode=0)
    assert idx[0, 0].tolist() == _explicit_topk(q, keys[0][:, 0], w, 2, 5, 8, causal=False)[0]


# --------------------------------------------------------- sparse flash attention
def test_sparse_flash_attention_is_dense_attention_over_the_selected_keys():
    torch.manual_seed(8)
    lens_q, lens_kv = [1, 5, 2], [9, 5, 7]
    n, dc, dr, bs, kmax = 4, 16, 8, 4, 6
    lat = [torch.randn(lk, 1, dc) for lk in lens_kv]
    rope = [torch.randn(lk, 1, dr) for lk in lens_kv]
    kv_cache, _, table = write_paged(lat, lat, bs, 10, random.Random(2), torch.float32)
    kr_cache, _, table2 = write_paged(rope, rope, bs, 10, random.Random(2), torch.float32)
    assert torch.equal(table, table2)
    t = sum(lens_q)
    q, qr = torch.randn(t, n, dc), torch.randn(t, n, dr)
    g = torch.Generator().manual_seed(9)
    rows, sels = [], []
    for lq, lkv in zip(lens_q, lens_kv):
        for _i in range(lq):
            perm = torch.randperm(lkv, generator=g).tolist()
            k = int(torch.randint(0, kmax + 1, (1,), generator=g))
            sel = perm[:k]                      # may include causally invisible keys: op must drop them
            sels.append(sel)
            rows.append(sel + [-1] * (kmax - len(sel)))
    rows[0] = [3, -1, 5, -1, -1, -1]            # entries after the first -1 are ignored
    sels[0] = [3]
    idx = torch.tensor(rows, dtype=torch.int32).view(t, 1, kmax)
    scale = 0.3
    out, smax, ssum = npu_sparse_flash_attention(
        q, kv_cache, kv_cache, idx, scale, block_table=table,
        actual_seq_lengths_query=torch.tensor([1, 6, 8], dtype=torch.int32),
        actual_seq_lengths_kv=torch.tensor(lens_kv, dtype=torch.int32), query_rope=qr,
        key_rope=kr_cache, sparse_block_size=1, layout_query="TND", layout_kv="PA_BSND",
        sparse_mode=3, attention_mode=2)
    assert smax.shape == ssum.shape == (0,)  # as torch_npu's meta: empty unless asked
    start = 0
    for b, (lq, lkv) in enumerate(zip(lens_q, lens_kv)):
        kfull = torch.cat([lat[b], rope[b]], -1)            # [Lkv, 1, dc+dr]
        qfull = torch.cat([q[start:start + lq], qr[start:start + lq]], -1)
        my = sels[start:start + lq]
        want, _ = dense_attention(qfull, kfull, lat[b], scale,
                                  lambda i, j, my=my, off=lkv - lq: j in my[i] and j <= off + i)
        torch.testing.assert_close(out[start:start + lq], want, rtol=1e-4, atol=1e-4)
        start += lq
    assert (out[[i for i, s in enumerate(sels) if not s]] == 0).all() if any(not s for s in sels) else True


def test_sparse_flash_attention_sinks_join_the_denominator():
    kv = torch.randn(1, 4, 1, 8)
    kr = torch.zeros(1, 4, 1, 4)
    q, qr = torch.randn(1, 2, 8), torch.zeros(1, 2, 4)
    sinks = torch.tensor([0.5, -1.0])
    idx = torch.tensor([[[0, 2, -1]]], dtype=torch.int32)
    common = dict(block_table=torch.tensor([[0]], dtype=torch.int32),
                  actual_seq_lengths_query=torch.tensor([1], dtype=torch.int32),
                  actual_seq_lengths_kv=torch.tensor([4], dtype=torch.int32), query_rope=qr,
                  key_rope=kr, layout_query="TND", layout_kv="PA_BSND", attention_mode=2)
    out, _, _ = npu_sparse_flash_attention(q, kv, kv, idx, 1.0, sinks=sinks, **common)
    for h in range(2):
        s = [float(q[0, h] @ kv[0, j, 0]) for j in (0, 2)]
        z = sum(math.exp(v) for v in s) + math.exp(float(sinks[h]))
        want = sum(math.exp(v) / z * kv[0, j, 0].double() for v, j in zip(s, (0, 2)))
        torch.testing.assert_close(out[0, h].double(), want, rtol=1e-5, atol=1e-5)


def _sfa_one_token(sparse_indices, **over):
    kv = torch.randn(1, 16, 1, 8)
    kw = dict(block_table=torch.tensor([[0]], dtype=torch.int32),
              actual_seq_lengths_query=torch.tensor([1], dtype=torch.int32),
              actual_seq_lengths_kv=torch.tensor([4], dtype=torch.int32),
              query_rope=torch.zeros(1, 2, 4), key_rope=torch.zeros(1, 16, 1, 4),
              layout_query="TND", layout_kv="PA_BSND", attention_mode=2)
    kw.update(over)
    return npu_sparse_flash_attention(torch.randn(1, 2, 8), kv, kv, sparse_indices, 1.0, **kw)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_sparse_flash_attention_refuses_an_empty_selection_dimension(device):
    """torch-npu 2.13 docs: sparse_indices is [Q_T, KV_N, sparse_size] with sparse_size > 0
    (a row with nothing selected is -1 padding, not a zero-width tensor)."""
    empty = torch.zeros(1, 1, 0, dtype=torch.int32)
    if device == "meta":
        with pytest.raises(ValueError, match=r"sparse_indices.*sparse_size.*must be > 0, got 0"):
            npu_sparse_flash_attention(
                torch.empty(1, 2, 8, device="meta"), (kv := torch.empty(1, 16, 1, 8, device="meta")),
                kv, empty.to("meta"), 1.0,
                block_table=torch.empty(1, 1, dtype=torch.int32, device="meta"),
                query_rope=torch.empty(1, 2, 4, device="meta"),
                key_rope=torch.empty(1, 16, 1, 4, device="meta"), layout_query="TND",
                layout_kv="PA_BSND", attention_mode=2)
        return
    with pytest.raises(ValueError, match=r"sparse_indices.*sparse_size.*must be > 0, got 0"):
        _sfa_one_token(empty)
    out, _, _ = _sfa_one_token(torch.full((1, 1, 1), -1, dtype=torch.int32))
    assert torch.equal(out, torch.zeros(1, 2, 8))  # nothing selected: -1 padding gives 0


@pytest.mark.parametrize("size,error,needle", [
    (0, ValueError, "sparse_block_size must be a power of 2 in [1, 128], got 0"),
    (3, ValueError, "sparse_block_size must be a power of 2 in [1, 128], got 3"),
    (256, ValueError, "sparse_block_size must be a power of 2 in [1, 128], got 256"),
    (4, NotImplementedError, "sparse_block_size 4 not emulated (1 only)"),
])
def test_sparse_flash_attention_names_the_sparse_block_size_it_refuses(size, error, needle):
    with pytest.raises(error) as info:
        _sfa_one_token(torch.tensor([[[0, -1]]], dtype=torch.int32), sparse_block_size=size)
    assert needle in str(info.value)


# --------------------------------------------------------------------- meta
def test_meta_implementations_give_shapes_without_data():
    m = dict(device="meta")
    t, n = 5, 4
    y = npu_interleave_rope(torch.empty(t, n, 1, 64, **m), torch.empty(t, 1, 1, 64, **m),
                            torch.empty(t, 1, 1, 64, **m))
    assert y.shape == (t, n, 1, 64) and y.device.type == "meta"
    yq, s = npu_dynamic_quant(torch.empty(t, 32, **m))
    assert yq.dtype == torch.int8 and s.shape == (t,)
    out = npu_quant_matmul(torch.empty(t, 32, dtype=torch.int8, **m),
                           torch.empty(32, 8, dtype=torch.int8, **m), torch.empty(8, **m),
                           output_dtype=torch.bfloat16)
    assert out.shape == (t, 8) and out.dtype == torch.bfloat16
    idx, _ = npu_lightning_indexer(torch.empty(t, 2, 16, **m), torch.empty(3, 16, 1, 16, **m),
                                   torch.empty(t, 2, **m), block_table=torch.empty(1, 3, dtype=torch.int32, **m),
                                   layout_query="TND", layout_key="PA_BSND", sparse_count=32)
    assert idx.shape == (t, 1, 32) and idx.dtype == torch.int32
    o, _, _ = npu_sparse_flash_attention(
        torch.empty(t, n, 512, **m), (kv := torch.empty(3, 16, 1, 512, **m)), kv,
        torch.empty(t, 1, 32, dtype=torch.int32, **m), 0.1,
        block_table=torch.empty(1, 3, dtype=torch.int32, **m), query_rope=torch.empty(t, n, 64, **m),
        key_rope=torch.empty(3, 16, 1, 64, **m), layout_query="TND", layout_kv="PA_BSND",
        attention_mode=2)
    assert o.shape == (t, n, 512)


def test_lightning_indexer_ties_at_the_boundary_keep_the_top_score_multiset():
    """Equal scores: the selected scores are the top ones (which tied key wins: the lower
    position, ``test_lightning_indexer_ties.py``)."""
    torch.manual_seed(10)
    base = torch.randn(4, 1, 8)
    keys = [torch.cat([base, base, base[:2]])]            # 10 keys, each score appears 2-3 times
    kc, _, table = write_paged(keys, keys, 4, 4, random.Random(3), torch.float32)
    q, w = torch.randn(1, 2, 8), torch.rand(1, 2) + 0.1
    idx, _ = npu_lightning_indexer(q, kc, w, actual_seq_lengths_query=torch.tensor([1], dtype=torch.int32),
                                   actual_seq_lengths_key=torch.tensor([10], dtype=torch.int32),
                                   block_table=table, layout_query="TND", layout_key="PA_BSND",
                                   sparse_count=5, sparse_mode=3)
    score = [sum(float(w[0, h]) * max(0.0, float(q[0, h] @ keys[0][j, 0])) for h in range(2))
             for j in range(10)]
    got = idx[0, 0].tolist()
    assert len(set(got)) == 5 and all(0 <= j < 10 for j in got)
    assert sorted((round(score[j], 5) for j in got), reverse=True) == \
        sorted((round(v, 5) for v in score), reverse=True)[:5]
