"""The FIA reference operator against independent dense attention.

The dense comparison runs on both emulation paths: the compiled kernel (the default)
and the Python reference (forced); ``test_emu_kernels.py`` compares the two directly."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.ut.dense import dense_attention, emulation_path, write_paged
from vllm_ascend_ext.ops.fia import causal_mask_2048, npu_fused_infer_attention_score
from vllm_ascend_ext.ops.fia_checks import FIAArgumentError

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def _batch(rng, kinds, nq, nkv, d, bs, dtype):
    """Random batch: per request (q_len, kv_len) for decode / spec / chunk / prefill."""
    lens = []
    for kind in kinds:
        if kind == "decode":
            lq = 1
            lkv = rng.randint(1, 300)
        elif kind == "spec":  # speculative verify: 1 + k tokens at the end
            lq = rng.randint(2, 4)
            lkv = rng.randint(lq, 300)
        elif kind == "chunk":  # chunked prefill on a cached prefix
            lq = rng.randint(2, 40)
            lkv = lq + rng.randint(1, 200)
        else:  # fresh prefill
            lq = rng.randint(2, 60)
            lkv = lq
        lens.append((lq, lkv))
    seq_k = [torch.randn(lkv, nkv, d) for _, lkv in lens]
    seq_v = [torch.randn(lkv, nkv, d) for _, lkv in lens]
    qs = [torch.randn(lq, nq, d) for lq, _ in lens]
    nblocks = sum(-(-lkv // bs) for _, lkv in lens) + 3
    kc, vc, table = write_paged(seq_k, seq_v, bs, nblocks, rng, dtype)
    return lens, qs, seq_k, seq_v, kc, vc, table


def _expected(lens, qs, seq_k, seq_v, scale, dtype, mode):
    outs, lses = [], []
    for (lq, lkv), q, k, v in zip(lens, qs, seq_k, seq_v):
        off = lkv - lq
        if mode == 3:
            vis = lambda i, j, off=off: j <= i + off  # noqa: E731
        else:
            vis = lambda i, j: True  # noqa: E731
        o, lse = dense_attention(q.to(dtype).float(), k.to(dtype).float(),
                                 v.to(dtype).float(), scale, vis)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def _run(lens, qs, kc, vc, table, nq, nkv, d, bs, dtype, mode, layout="BnBsH", lse=True):
    query = torch.cat(qs).to(dtype)
    cu, acc = [], 0
    for lq, _ in lens:
        acc += lq
        cu.append(acc)
    if layout == "BnBsH":
        key, value = kc.view(kc.shape[0], bs, -1), vc.view(vc.shape[0], bs, -1)
    else:  # BnNBsD
        key, value = kc.transpose(1, 2).contiguous(), vc.transpose(1, 2).contiguous()
    return npu_fused_infer_attention_score(
        query, key, value,
        atten_mask=causal_mask_2048() if mode == 3 else None,
        actual_seq_lengths=cu, actual_seq_lengths_kv=[lkv for _, lkv in lens],
        block_table=table, num_heads=nq, num_key_value_heads=nkv, scale=d**-0.5,
        input_layout="TND", sparse_mode=mode, block_size=bs, softmax_lse_flag=lse,
    )


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    kinds=st.lists(st.sampled_from(["decode", "spec", "chunk", "prefill"]), min_size=1, max_size=6),
    gqa=st.sampled_from([1, 2, 4, 8]),
    nkv=st.sampled_from([1, 2]),
    d=st.sampled_from([64, 128, 256]),
    bs=st.sampled_from([16, 128]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    layout=st.sampled_from(["BnBsH", "BnNBsD"]),
    lse=st.booleans(),
    path=st.sampled_from(["compiled", "reference"]),
)
def test_paged_causal_matches_dense(seed, kinds, gqa, nkv, d, bs, dtype, layout, lse, path):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    if d == 256:   # FIA's TND split-fuse path: GQA and a 3-D cache (fia_checks)
        gqa, layout = max(gqa, 2), "BnBsH"
    nq = nkv * gqa
    lens, qs, seq_k, seq_v, kc, vc, table = _batch(rng, kinds, nq, nkv, d, bs, dtype)
    with emulation_path(path):
        out, got_lse = _run(lens, qs, kc, vc, table, nq, nkv, d, bs, dtype, 3, layout, lse)
    exp_out, exp_lse = _expected(lens, [q.to(dtype) for q in qs], seq_k, seq_v, d**-0.5, dtype, 3)
    assert out.dtype == dtype and out.shape == exp_out.shape
    torch.testing.assert_close(out.float(), exp_out, atol=TOL[dtype], rtol=TOL[dtype])
    if lse:
        torch.testing.assert_close(got_lse[..., 0], exp_lse, atol=1e-4, rtol=1e-4)
    else:
        assert got_lse.shape == (0,)


def _paged_attention_f64(query, key_blocks, value_blocks, table, cu_q, kv_lens, nkv, scale):
    """Independent: causal (bottom-right aligned) paged attention in float64, one query
    token and one head at a time. key_blocks/value_blocks [nb, bs, KV_N, Dk/Dv]; logical
    position p of request b is row p % bs of block table[b, p // bs]."""
    bs, nq, dv = key_blocks.shape[1], query.shape[1], value_blocks.shape[-1]
    out = torch.zeros(query.shape[0], nq, dv, dtype=torch.float64)
    start = 0
    for b, end in enumerate(cu_q):
        lq, lkv = end - start, kv_lens[b]
        rows = [(int(table[b, p // bs]), p % bs) for p in range(lkv)]
        k = torch.stack([key_blocks[blk, slot] for blk, slot in rows]).double()    # [Lkv, KV_N, Dk]
        v = torch.stack([value_blocks[blk, slot] for blk, slot in rows]).double()  # [Lkv, KV_N, Dv]
        for i in range(lq):
            seen = lkv - lq + i + 1
            for h in range(nq):
                kh = h // (nq // nkv)
                s = (k[:seen, kh] @ query[start + i, h].double()) * scale
                out[start + i, h] = torch.softmax(s, dim=0) @ v[:seen, kh]
        start = end
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lse", [False, True])
@pytest.mark.parametrize("layout", ["BnBsH", "BnNBsD"])
@pytest.mark.parametrize("path", ["compiled", "reference"])
def test_paged_decode_value_head_dim_differs_from_key(path, layout, lse, dtype):
    """Paged TND decode with Dk = 192, Dv = 128 (the owners' paged decode golden, and what
    ``tnd_head_dims_refusal`` / docs/npu-ops.md take): output [T, N, Dv]."""
    torch.manual_seed(11)
    rng = random.Random(11)
    nq, nkv, dk, dv, bs, nb = 4, 2, 192, 128, 16, 12
    kv_lens, cu_q = [37, 5, 16], [1, 2, 3]            # one query token per request
    kb = torch.full((nb, bs, nkv, dk), 1e3).to(dtype)  # garbage where no request reads
    vb = torch.full((nb, bs, nkv, dv), -1e3).to(dtype)
    free = list(range(nb))
    rng.shuffle(free)
    table = torch.zeros(len(kv_lens), 3, dtype=torch.int32)
    for b, lkv in enumerate(kv_lens):
        for n in range(-(-lkv // bs)):
            table[b, n] = blk = free.pop()
            rows = min(bs, lkv - n * bs)
            kb[blk, :rows] = torch.randn(rows, nkv, dk).to(dtype)
            vb[blk, :rows] = torch.randn(rows, nkv, dv).to(dtype)
    query = torch.randn(3, nq, dk).to(dtype)
    if layout == "BnBsH":
        key, value = kb.view(nb, bs, nkv * dk), vb.view(nb, bs, nkv * dv)
    else:
        key, value = kb.transpose(1, 2).contiguous(), vb.transpose(1, 2).contiguous()
    kwargs = dict(atten_mask=causal_mask_2048(), actual_seq_lengths=cu_q,
                  actual_seq_lengths_kv=kv_lens, block_table=table, num_heads=nq,
                  num_key_value_heads=nkv, scale=dk**-0.5, input_layout="TND", sparse_mode=3,
                  block_size=bs, softmax_lse_flag=lse)
    with emulation_path(path):
        out, _ = npu_fused_infer_attention_score(query, key, value, **kwargs)
    exp = _paged_attention_f64(query, kb, vb, table, cu_q, kv_lens, nkv, dk**-0.5)
    assert out.shape == (3, nq, dv) and out.dtype == dtype
    torch.testing.assert_close(out.double(), exp, atol=TOL[dtype], rtol=TOL[dtype])
    # the meta layer: the same checks, output [T, N, Dv]
    meta = {n: t.to("meta") if isinstance(t, torch.Tensor) else t for n, t in kwargs.items()}
    out_m, _ = npu_fused_infer_attention_score(query.to("meta"), key.to("meta"),
                                               value.to("meta"), **meta)
    assert out_m.device.type == "meta" and out_m.shape == (3, nq, dv)


def test_paged_value_head_dim_differs_passes_the_contract(contract):
    """Contract mode: torch-npu 2.13's schema, official meta (value_d from the paged value
    cache) and documented rules take Dk = 192 / Dv = 128, and the emulation's outputs
    have the official meta's shapes."""
    h = contract()
    nq, nkv, bs = 4, 2, 16
    out, lse = npu_fused_infer_attention_score(
        torch.randn(2, nq, 192, dtype=torch.bfloat16),
        torch.randn(4, bs, nkv * 192, dtype=torch.bfloat16),
        torch.randn(4, bs, nkv * 128, dtype=torch.bfloat16), atten_mask=causal_mask_2048(),
        actual_seq_lengths=[1, 2], actual_seq_lengths_kv=[20, 9],
        block_table=torch.tensor([[0, 3], [1, 2]], dtype=torch.int32), num_heads=nq,
        num_key_value_heads=nkv, scale=192**-0.5, input_layout="TND", sparse_mode=3,
        block_size=bs, softmax_lse_flag=True)
    assert out.shape == (2, nq, 128) and lse.shape == (2, nq, 1)
    assert h.calls == {"npu_fused_infer_attention_score": 1}


def test_sparse_mode_0_without_mask_attends_everything():
    rng = random.Random(1)
    torch.manual_seed(1)
    lens, qs, seq_k, seq_v, kc, vc, table = _batch(
        rng, ["chunk", "prefill", "decode"], 4, 2, 64, 16, torch.float32)
    out, _ = _run(lens, qs, kc, vc, table, 4, 2, 64, 16, torch.float32, 0)
    exp, _ = _expected(lens, qs, seq_k, seq_v, 64**-0.5, torch.float32, 0)
    torch.testing.assert_close(out, exp, atol=1e-5, rtol=1e-5)
    causal, _ = _expected(lens, qs, seq_k, seq_v, 64**-0.5, torch.float32, 3)
    assert (out - causal).abs().max() > 1e-2  # the modes really differ here


def test_band_mode_4_and_left_up_mode_2():
    torch.manual_seed(2)
    lq, lkv, d = 5, 12, 64
    q, k, v = torch.randn(lq, 2, d), torch.randn(lkv, 1, d), torch.randn(lkv, 1, d)
    kc, vc, table = write_paged([k], [v], 16, 2, random.Random(0), torch.float32)
    common = dict(actual_seq_lengths=[lq], actual_seq_lengths_kv=[lkv], block_table=table,
                  num_heads=2, num_key_value_heads=1, scale=0.125, input_layout="TND",
                  block_size=16, atten_mask=causal_mask_2048())
    off = lkv - lq
    out4, _ = npu_fused_infer_attention_score(q, kc.view(2, 16, -1), vc.view(2, 16, -1),
                                              sparse_mode=4, pre_tokens=3, next_tokens=0, **common)
    exp4, _ = dense_attention(q, k, v, 0.125, lambda i, j: i + off - 3 <= j <= i + off)
    torch.testing.assert_close(out4, exp4, atol=1e-5, rtol=1e-5)
    out2, _ = npu_fused_infer_attention_score(q, kc.view(2, 16, -1), vc.view(2, 16, -1),
                                              sparse_mode=2, **common)
    exp2, _ = dense_attention(q, k, v, 0.125, lambda i, j: j <= i)
    torch.testing.assert_close(out2, exp2, atol=1e-5, rtol=1e-5)


def test_packed_kv_without_block_table_uses_cumulative_kv_lengths():
    torch.manual_seed(3)
    lens = [(3, 3), (4, 4)]
    qs = [torch.randn(lq, 2, 64) for lq, _ in lens]
    ks = [torch.randn(lkv, 2, 64) for _, lkv in lens]
    vs = [torch.randn(lkv, 2, 64) for _, lkv in lens]
    out, _ = npu_fused_infer_attention_score(
        torch.cat(qs), torch.cat(ks), torch.cat(vs), atten_mask=causal_mask_2048(),
        actual_seq_lengths=[3, 7], actual_seq_lengths_kv=[3, 7], num_heads=2,
        num_key_value_heads=2, scale=0.125, input_layout="TND", sparse_mode=3)
    exp, _ = _expected(lens, qs, ks, vs, 0.125, torch.float32, 3)
    torch.testing.assert_close(out, exp, atol=1e-5, rtol=1e-5)


def test_rows_with_no_visible_key_are_zero():
    torch.manual_seed(4)
    q, k, v = torch.randn(4, 1, 64), torch.randn(2, 1, 64), torch.randn(2, 1, 64)
    kc, vc, table = write_paged([k], [v], 16, 1, random.Random(0), torch.float32)
    for flag in (False, True):
        out, _ = npu_fused_infer_attention_score(
            q, kc.view(1, 16, -1), vc.view(1, 16, -1), atten_mask=causal_mask_2048(),
            actual_seq_lengths=[4], actual_seq_lengths_kv=[2], block_table=table, num_heads=1,
            scale=0.125, input_layout="TND", sparse_mode=3, block_size=16,
            softmax_lse_flag=flag)
        assert torch.all(out[:2] == 0)  # Lq=4 > Lkv=2: rows 0 and 1 see nothing
        exp, _ = dense_attention(q, k, v, 0.125, lambda i, j: j <= i - 2)
        torch.testing.assert_close(out, exp, atol=1e-5, rtol=1e-5)


def test_lse_not_requested_is_empty_as_torch_npus_meta_returns_it():
    q = torch.randn(1, 1, 64)
    kc = torch.randn(1, 16, 64)
    _, lse = npu_fused_infer_attention_score(
        q, kc, kc, actual_seq_lengths=[1], actual_seq_lengths_kv=[5],
        block_table=torch.zeros(1, 1, dtype=torch.int32), num_heads=1, input_layout="TND",
        block_size=16)
    assert lse.shape == (0,)  # torch-npu 2.13 meta: empty when softmax_lse_flag is False


def _valid_kwargs():
    return dict(
        query=torch.randn(3, 4, 64), key=torch.randn(2, 16, 2 * 64),
        value=torch.randn(2, 16, 2 * 64), atten_mask=causal_mask_2048(),
        actual_seq_lengths=[1, 3], actual_seq_lengths_kv=[5, 9],
        block_table=torch.tensor([[0], [1]], dtype=torch.int32), num_heads=4,
        num_key_value_heads=2, scale=0.125, input_layout="TND", sparse_mode=3, block_size=16,
    )


@pytest.mark.parametrize("change,needle", [
    (dict(query=torch.randn(3, 4, 96)), "head size 96"),
    (dict(query=torch.randn(3, 4, 64).double()), "dtype"),
    (dict(num_key_value_heads=3), "not divisible"),
    (dict(block_table=torch.tensor([[0], [1]])), "block_table must be int32"),
    (dict(block_size=8), "block_size=8"),
    (dict(actual_seq_lengths=[1, 2]), "must equal the packed token count 3"),
    (dict(actual_seq_lengths=[2, 1, 3]), "non-decreasing"),
    (dict(actual_seq_lengths_kv=[5]), "as long as the batch"),
    (dict(actual_seq_lengths_kv=[5, 17]), "outside 0..16"),
    (dict(atten_mask=None), "needs the 2048x2048"),
    (dict(atten_mask=torch.ones(128, 128, dtype=torch.bool)), "shape (2048, 2048)"),
    (dict(sparse_mode=1), "sparse_mode=1"),
    (dict(num_heads=8), "num_heads=8"),
    (dict(block_size=1024), "up to 512"),
    # head size 256 only on the split-fuse path: GQA, sparse_mode 0/3, a 3-D cache
    (dict(query=torch.randn(3, 2, 256), num_heads=2, key=torch.zeros(2, 16, 512),
          value=torch.zeros(2, 16, 512)), "as many KV heads as query heads (2)"),
    (dict(query=torch.randn(3, 4, 256), key=torch.zeros(2, 2, 16, 256),
          value=torch.zeros(2, 2, 16, 256)), "3-D (BnBsH) paged cache, not 4-D"),
    (dict(query=torch.randn(3, 4, 256), sparse_mode=2, key=torch.zeros(2, 16, 512),
          value=torch.zeros(2, 16, 512)), "takes sparse_mode (0, 3), not 2"),
    (dict(query=torch.randn(3, 4, 256)), "head size 256 (value 64) is not taken"),
    (dict(actual_seq_lengths=torch.tensor([1, 3])), "host list"),
    # paged Dv != Dk: only Dk = 192 with Dv 128 (or 192); the value cache's blocks must match
    (dict(value=torch.zeros(2, 16, 2 * 32)), "head size 64 (value 32) is not taken"),
    (dict(query=torch.randn(3, 4, 192), key=torch.zeros(2, 16, 2 * 192),
          value=torch.zeros(3, 16, 2 * 128)), "value cache (3, 16, 256) does not match"),
    (dict(query=torch.randn(3, 4, 192), key=torch.zeros(2, 16, 2 * 192),
          value=torch.zeros(2, 2, 16, 128)), "value cache (2, 2, 16, 128) does not match"),
    (dict(query=torch.randn(3, 4, 192), key=torch.zeros(2, 16, 2 * 192),
          value=torch.zeros(2, 16, 255)), "value cache (2, 16, 255) does not match"),
])
def test_rejects_what_the_npu_rejects(change, needle):
    kwargs = _valid_kwargs()
    kwargs.update(change)
    q, k, v = kwargs.pop("query"), kwargs.pop("key"), kwargs.pop("value")
    with pytest.raises(FIAArgumentError, match=None) as info:
        npu_fused_infer_attention_score(q, k, v, **kwargs)
    assert needle in str(info.value)


def test_valid_kwargs_pass_and_unimplemented_options_are_named():
    kwargs = _valid_kwargs()
    q, k, v = kwargs.pop("query"), kwargs.pop("key"), kwargs.pop("value")
    npu_fused_infer_attention_score(q, k, v, **kwargs)
    with pytest.raises(NotImplementedError, match="pse_shift"):
        npu_fused_infer_attention_score(q, k, v, pse_shift=torch.zeros(1), **kwargs)
    with pytest.raises(NotImplementedError, match="BSH"):
        kwargs["input_layout"] = "BSH"
        npu_fused_infer_attention_score(q, k, v, **kwargs)


def test_bucket_plan_covers_every_request_once_and_merges_small_ones():
    from vllm_ascend_ext.ops.fia import plan_buckets

    q = (1, 1, 3, 1, 200, 0, 2)
    kv = (40, 900, 50, 35, 1200, 0, 60)
    groups = plan_buckets(q, kv)
    flat = sorted(b for g in groups for b in g)
    assert flat == [0, 1, 2, 3, 4, 6]  # the zero-query padding request is skipped
    assert any({0, 3} <= set(g) for g in groups)  # short decodes share one call
    assert not any({0, 4} <= set(g) for g in groups)  # no decode padded to 200 rows


def test_plan_memo_checks_once_per_step_and_never_hides_a_bad_call(monkeypatch):
    """Layers of a step pass the same host tuples: the per-request checks run once; a
    call whose shapes differ is checked again (and refused), lists are never memoized."""
    from vllm_ascend_ext.ops import fia_checks

    calls = []
    real = fia_checks.check_fia
    monkeypatch.setattr(fia_checks, "check_fia", lambda *a, **k: calls.append(1) or real(*a, **k))
    memo = fia_checks.PlanMemo()
    q, k = torch.randn(3, 4, 64), torch.randn(2, 16, 2 * 64)
    table = torch.zeros(2, 1, dtype=torch.int32)
    kw = dict(atten_mask=None, actual_seq_lengths=(1, 3), actual_seq_lengths_kv=(5, 16),
              block_table=table, num_heads=4, input_layout="TND", num_key_value_heads=2,
              sparse_mode=0, block_size=16, unsupported={})
    plan = memo.check(q, k, k, **kw)
    assert memo.check(q, k, k, **kw) is plan and len(calls) == 1
    # a split step: decode and prefill spans alternate in every layer, both stay known
    other = {**kw, "actual_seq_lengths": (2, 3), "actual_seq_lengths_kv": (6, 16)}
    plan2 = memo.check(q, k, k, **other)
    assert memo.check(q, k, k, **kw) is plan and memo.check(q, k, k, **other) is plan2
    assert len(calls) == 2
    with pytest.raises(FIAArgumentError, match="16 heads but num_heads=4"):
        memo.check(torch.randn(3, 16, 64), k, k, **kw)
    with pytest.raises(FIAArgumentError, match="outside 0..16"):
        memo.check(q, k, k, **{**kw, "actual_seq_lengths_kv": (5, 17)})
    lists = {**kw, "actual_seq_lengths": [1, 3]}
    memo.check(q, k, k, **lists)
    lists["actual_seq_lengths"][1] = 4  # a list can change in place: checked every time
    with pytest.raises(FIAArgumentError, match="must equal the packed token count 3"):
        memo.check(q, k, k, **lists)
