"""MoE operator references against explicit per-token, per-expert loops in float64.

Each expected value is built element by element from the documented semantics (Python
lists and ``math``, one token and one expert at a time), never from the code under test.
Hypothesis draws uneven expert loads, empty experts, top-k 1..8, group edge cases and
ties (logits on a coarse grid).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_ascend_ext.ops.grouped_matmul import (
    DTYPE_ENUM,
    npu_grouped_matmul,
    npu_swiglu,
)
from vllm_ascend_ext.ops.moe_dispatch import npu_moe_init_routing_v2, npu_moe_token_unpermute
from vllm_ascend_ext.ops.moe_gating import npu_moe_gating_top_k, npu_moe_gating_top_k_softmax

SETTINGS = settings(max_examples=40, deadline=None)


def _best_first(values: list[float], eligible: list[bool] | None = None) -> list[int]:
    """Indices by value, best first; ties: lower index first; ineligible ones last."""
    order = list(range(len(values)))
    return sorted(order, key=lambda i: (0 if eligible is None or eligible[i] else 1, -values[i], i))


def _loop_gating(x, k, bias, k_group, group_count, mode, norm_type, scaling, eps):
    out_w, out_i = [], []
    for row in x.double().tolist():
        if norm_type == 0:
            z = sum(math.exp(v - max(row)) for v in row)
            score = [math.exp(v - max(row)) / z for v in row]
        else:
            score = [1 / (1 + math.exp(-v)) for v in row]
        sel = [s + (0.0 if bias is None else float(b)) for s, b in
               zip(score, bias.double().tolist() if bias is not None else [0] * len(row))]
        size = len(row) // group_count
        eligible = [True] * len(row)
        if group_count > 1:
            gscore = []
            for g in range(group_count):
                members = sorted(sel[g * size:(g + 1) * size], reverse=True)
                gscore.append(members[0] if mode == 0 else members[0] + members[1])
            kept = set(_best_first(gscore)[:k_group])
            eligible = [i // size in kept for i in range(len(row))]
        chosen = _best_first(sel, eligible)[:k]
        w = [score[e] for e in chosen]
        if norm_type == 1:
            total = sum(w)
            w = [v / (total + eps) for v in w]
        out_w.append([v * scaling for v in w])
        out_i.append(chosen)
    return out_w, out_i


@st.composite
def gating_cases(draw):
    group_count = draw(st.sampled_from([1, 1, 2, 4]))
    size = draw(st.integers(3, 6))
    experts = group_count * size
    k_group = draw(st.integers(1, group_count))
    k = draw(st.integers(1, min(8, size * k_group)))
    tokens = draw(st.integers(1, 6))
    grid = draw(st.sampled_from([0.25, 1.0]))       # 1.0: many ties
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    x = torch.round(torch.randn(tokens, experts, generator=g) * 2 / grid) * grid
    bias = (torch.round(torch.randn(experts, generator=g) * 4) / 8
            if draw(st.booleans()) else None)
    return dict(x=x, k=k, bias=bias, k_group=k_group, group_count=group_count,
                mode=draw(st.sampled_from([0, 1])), norm_type=draw(st.sampled_from([0, 1])),
                scaling=draw(st.sampled_from([1.0, 2.5])))


@SETTINGS
@given(gating_cases())
def test_gating_top_k_matches_a_per_token_loop(case):
    x, bias = case["x"], case["bias"]
    y, idx, norm = npu_moe_gating_top_k(
        x, case["k"], bias=bias, k_group=case["k_group"], group_count=case["group_count"],
        group_select_mode=case["mode"], norm_type=case["norm_type"],
        routed_scaling_factor=case["scaling"], out_flag=True)
    want_w, want_i = _loop_gating(x, case["k"], bias, case["k_group"], case["group_count"],
                                  case["mode"], case["norm_type"], case["scaling"], 1e-20)
    assert idx.dtype == torch.int32 and y.dtype == x.dtype and norm.dtype == torch.float32
    assert idx.tolist() == want_i
    torch.testing.assert_close(y.double(), torch.tensor(want_w, dtype=torch.float64),
                               rtol=1e-5, atol=1e-6)


def test_gating_bias_selects_but_never_weighs():
    x = torch.tensor([[0.0, 0.1, 0.2, 0.3]])
    bias = torch.tensor([5.0, 0.0, 0.0, 0.0])        # drags expert 0 in
    y, idx, _ = npu_moe_gating_top_k(x, 2, bias=bias, norm_type=1)
    assert idx.tolist() == [[0, 3]]
    s0, s3 = 1 / (1 + math.exp(0.0)), 1 / (1 + math.exp(-0.3))
    torch.testing.assert_close(y, torch.tensor([[s0 / (s0 + s3), s3 / (s0 + s3)]]))


@pytest.mark.parametrize("kwargs,message", [
    (dict(group_count=2), "group size must be a whole number greater than 2"),   # 4/2 = 2
    (dict(k=5), "k 5 not in"),
    (dict(k_group=2), "k_group 2 not in"),
    (dict(renorm=1), "only 0 is supported"),
])
def test_gating_refuses_what_the_kernel_documents_as_invalid(kwargs, message):
    args = dict(k=2)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        npu_moe_gating_top_k(torch.randn(3, 4), args.pop("k"), **args)


@SETTINGS
@given(st.integers(1, 6), st.integers(1, 12), st.integers(1, 8), st.integers(0, 2**16))
def test_gating_top_k_softmax_matches_a_loop_and_numbers_rows_k_major(tokens, experts, k, seed):
    k = min(k, experts)
    g = torch.Generator().manual_seed(seed)
    x = torch.round(torch.randn(tokens, experts, generator=g) * 2) / 2
    finished = torch.rand(tokens, generator=g) < 0.3
    y, idx, rows = npu_moe_gating_top_k_softmax(x, finished, k=k)
    for n, row in enumerate(x.double().tolist()):
        z = sum(math.exp(v) for v in row)
        probs = [math.exp(v) / z for v in row]
        chosen = _best_first(probs)[:k]
        assert idx[n].tolist() == ([experts] * k if finished[n] else chosen)
        assert y[n].tolist() == pytest.approx([probs[e] for e in chosen], rel=1e-5)
        assert rows[n].tolist() == [j * tokens + n for j in range(k)]


def test_gating_top_k_softmax_ranks_float16_input_in_half_precision():
    # experts 0 and 1 differ by 1e-4 in logit: float32 ranks expert 1 first; in half
    # precision their probabilities are one value, a tie the kernel gives to the lower id
    x = torch.tensor([[0.0, 1e-4, -3.0]])
    half_probs = [math.exp(v) / sum(math.exp(u) for u in x[0].tolist()) for v in x[0].tolist()]
    assert half_probs[1] > half_probs[0]
    p0, p1 = torch.tensor(half_probs[:2]).half().tolist()
    assert p0 == p1
    _, idx16, _ = npu_moe_gating_top_k_softmax(x.half(), None, k=1)
    assert idx16.tolist() == [[0]]
    for dtype in (torch.float32, torch.bfloat16):    # bf16 is widened to float32 first
        _, idx, _ = npu_moe_gating_top_k_softmax(x.to(dtype), None, k=1)
        assert idx.tolist() == [[1]]


@st.composite
def routing_cases(draw):
    tokens = draw(st.integers(1, 7))
    experts = draw(st.integers(1, 9))
    k = draw(st.integers(1, min(4, experts)))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    # Uneven loads and empty experts: ids drawn from a few experts only, repeats allowed.
    pool = torch.randint(0, experts, (max(1, experts // 2),), generator=g)
    ids = pool[torch.randint(0, pool.numel(), (tokens, k), generator=g)].to(torch.int32)
    start = draw(st.integers(0, experts - 1))
    end = draw(st.integers(start + 1, experts))
    full = draw(st.booleans())
    return dict(ids=ids, experts=experts, range=(0, experts) if full else (start, end),
                active=draw(st.sampled_from([-1, 0, tokens * k, max(1, tokens * k - 2)])),
                row_type=draw(st.sampled_from([0, 1])),
                x=torch.randn(tokens, 5, generator=g, dtype=torch.float64),
                scale=torch.rand(tokens, generator=g))


@SETTINGS
@given(routing_cases())
def test_init_routing_v2_matches_an_expert_by_expert_loop(case):
    ids, x, (start, end) = case["ids"], case["x"], case["range"]
    tokens, k = ids.shape
    ex, row_idx, tokens_out, ex_scale = npu_moe_init_routing_v2(
        x, ids, scale=case["scale"], active_num=case["active"], expert_num=case["experts"],
        expert_tokens_num_type=1, expert_tokens_num_flag=True,
        active_expert_range=[start, end], row_idx_type=case["row_type"])
    # Expected, by hand: experts ascending; within one expert, pairs in (token, k) order.
    order = [(n * k + j) for e in range(start, end) for n in range(tokens) for j in range(k)
             if ids[n, j] == e]
    rows = tokens * k if case["active"] <= 0 else min(case["active"], tokens * k)
    assert ex.shape == (rows, 5) and ex_scale.shape == (rows,)
    for dst, src in enumerate(order[:rows]):
        assert torch.equal(ex[dst], x[src // k])
        assert ex_scale[dst].item() == pytest.approx(case["scale"][src // k].item())
    assert not ex[len(order):].any()                 # pairs outside the range: no rows
    counts = [sum(1 for v in ids.flatten().tolist() if v == e) for e in range(start, end)]
    assert tokens_out.dtype == torch.int64
    assert tokens_out.tolist() == counts
    if case["row_type"] == 1:
        assert row_idx[:len(order)].tolist() == order
    else:
        want = [-1] * (tokens * k)
        for dst, src in enumerate(order):
            if dst < rows:
                want[src] = dst
        assert row_idx.tolist() == want


def test_init_routing_v2_refuses_the_documented_unsupported_cumsum_type():
    ids = torch.tensor([[0, 1]], dtype=torch.int32)
    with pytest.raises(ValueError, match="expert_tokens_num_type 0 .cumsum. is documented as "
                                         "unsupported"):
        npu_moe_init_routing_v2(torch.ones(1, 4), ids, expert_num=2, expert_tokens_num_type=0,
                                expert_tokens_num_flag=True)
    with pytest.raises(NotImplementedError, match="expert_tokens_num_type 2 is not emulated"):
        npu_moe_init_routing_v2(torch.ones(1, 4), ids, expert_num=2, expert_tokens_num_type=2,
                                expert_tokens_num_flag=True)


@st.composite
def gmm_cases(draw):
    experts = draw(st.integers(2, 6))
    counts = [draw(st.integers(0, 4)) for _ in range(experts)]   # empty experts included
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    m = sum(counts)
    return dict(counts=counts, x=torch.randn(m, 6, generator=g, dtype=torch.float64),
                w=torch.randn(experts, 6, 4, generator=g, dtype=torch.float64),
                cumsum=draw(st.booleans()))


@SETTINGS
@given(gmm_cases())
def test_grouped_matmul_matches_a_row_by_row_loop(case):
    counts, x, w = case["counts"], case["x"], case["w"]
    group_list = torch.tensor(counts, dtype=torch.int64)
    if case["cumsum"]:
        group_list = group_list.cumsum(0)
    (y,) = npu_grouped_matmul([x], [w], group_list=group_list, split_item=2, group_type=0,
                              group_list_type=0 if case["cumsum"] else 1)
    owner = [e for e, c in enumerate(counts) for _ in range(c)]
    for m in range(x.shape[0]):
        for n in range(w.shape[2]):
            want = sum(x[m, i].item() * w[owner[m], i, n].item() for i in range(6))
            assert y[m, n].item() == pytest.approx(want, abs=1e-9)


def test_grouped_matmul_w8a8_scales_per_channel_and_per_token():
    g = torch.Generator().manual_seed(1)
    x = torch.randint(-127, 128, (5, 8), generator=g, dtype=torch.int8)
    w = torch.randint(-127, 128, (2, 8, 3), generator=g, dtype=torch.int8)
    scale, pts = torch.rand(2, 3, generator=g), torch.rand(5, generator=g)
    (y,) = npu_grouped_matmul([x], [w], scale=[scale], per_token_scale=[pts],
                              group_list=torch.tensor([2, 3]), split_item=2, group_type=0,
                              group_list_type=1, output_dtype=DTYPE_ENUM[torch.float32])
    for m in range(5):
        e = 0 if m < 2 else 1
        for n in range(3):
            acc = sum(int(x[m, i]) * int(w[e, i, n]) for i in range(8))
            assert y[m, n].item() == pytest.approx(acc * scale[e, n].item() * pts[m].item(), rel=1e-5)


def test_swiglu_is_silu_of_the_first_half_times_the_second():
    x = torch.tensor([[1.0, -2.0, 3.0, 0.5]])
    silu = [v / (1 + math.exp(-v)) for v in (1.0, -2.0)]
    assert npu_swiglu(x).tolist()[0] == pytest.approx([silu[0] * 3.0, silu[1] * 0.5])


@SETTINGS
@given(st.integers(1, 6), st.integers(1, 4), st.integers(0, 2**16))
def test_token_unpermute_gathers_token_major_and_undoes_init_routing(tokens, k, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, 3, generator=g, dtype=torch.float64)
    ids = torch.randint(0, 5, (tokens, k), generator=g, dtype=torch.int32)
    probs = torch.rand(tokens, k, generator=g, dtype=torch.float64)
    ex, row_idx, _, _ = npu_moe_init_routing_v2(x, ids, expert_num=5, expert_tokens_num_type=1,
                                                expert_tokens_num_flag=True)
    permuted = ex * 10 + torch.arange(ex.shape[0], dtype=torch.float64)[:, None]  # rows differ
    out = npu_moe_token_unpermute(permuted, row_idx, probs=probs)
    for n in range(tokens):
        want = [sum(probs[n, j].item() * permuted[int(row_idx[n * k + j]), c].item()
                    for j in range(k)) for c in range(3)]
        assert out[n].tolist() == pytest.approx(want)
    # Round trip: weights summing to one give the tokens back.
    back = npu_moe_token_unpermute(ex, row_idx, probs=torch.full((tokens, k), 1.0 / k,
                                                                 dtype=torch.float64))
    torch.testing.assert_close(back, x)


def test_grouped_matmul_groups_end_before_the_rows_only_under_expert_parallelism():
    """Groups must cover the rows (the documented form); inside groups_may_end_early()
    (expert parallelism) they may end before them, and the rows past them are NaN
    (undefined on the NPU); groups past the rows are always refused."""
    from vllm_ascend_ext.ops.grouped_matmul import groups_may_end_early

    x, w = torch.randn(5, 4, dtype=torch.float64), torch.randn(2, 4, 3, dtype=torch.float64)
    short = dict(group_list=torch.tensor([2, 2]), split_item=2, group_type=0, group_list_type=1)
    with pytest.raises(ValueError, match="must cover x's 5 rows exactly"):
        npu_grouped_matmul([x], [w], **short)
    with groups_may_end_early():
        out = npu_grouped_matmul([x], [w], **short)[0]
        with pytest.raises(ValueError, match="must cover x's 5 rows exactly"):
            npu_grouped_matmul([x], [w], group_list=torch.tensor([3, 3]), split_item=2,
                               group_type=0, group_list_type=1)
    torch.testing.assert_close(out[:2], x[:2] @ w[0])
    torch.testing.assert_close(out[2:4], x[2:4] @ w[1])
    assert out[4].isnan().all()


def _official(name, *args, **kwargs):
    from vllm_ascend_ext.contract import metas

    def meta(v):
        if isinstance(v, torch.Tensor):
            return torch.empty_strided(tuple(v.shape), v.stride(), dtype=v.dtype, device="meta")
        if isinstance(v, list):
            return [meta(t) for t in v]
        return v

    metas.load()
    return metas.op(name)(*[meta(a) for a in args], **{k: meta(v) for k, v in kwargs.items()})


_ROUTING = dict(expert_num=4, expert_tokens_num_type=1, active_expert_range=[0, 4])
META_CASES = {
    "npu_moe_gating_top_k": (npu_moe_gating_top_k, lambda d: (torch.randn(3, 8, device=d), 2),
                             dict(norm_type=1)),
    "npu_moe_gating_top_k_softmax": (npu_moe_gating_top_k_softmax,
                                     lambda d: (torch.randn(3, 8, device=d), None, 2), {}),
    "npu_moe_init_routing_v2": (npu_moe_init_routing_v2, lambda d: (
        torch.randn(3, 4, device=d), torch.zeros(3, 2, dtype=torch.int32, device=d)),
        dict(_ROUTING, expert_tokens_num_flag=True)),
    "npu_moe_init_routing_v2 (no counts)": (npu_moe_init_routing_v2, lambda d: (
        torch.randn(3, 4, device=d), torch.zeros(3, 2, dtype=torch.int32, device=d)), _ROUTING),
    "npu_grouped_matmul": (npu_grouped_matmul, lambda d: (
        [torch.randn(5, 4, device=d)], [torch.randn(2, 4, 3, device=d)]),
        dict(group_list=torch.tensor([2, 3]), split_item=2, group_type=0, group_list_type=1)),
    "npu_moe_token_unpermute": (npu_moe_token_unpermute, lambda d: (
        torch.randn(6, 4, device=d), torch.arange(6, dtype=torch.int32, device=d)),
        dict(probs=torch.rand(3, 2))),
    "npu_swiglu": (npu_swiglu, lambda d: (torch.randn(3, 8, device=d),), {}),
}


@pytest.mark.parametrize("case", sorted(META_CASES))
def test_reference_and_meta_outputs_have_the_official_metas_shapes_and_dtypes(case):
    op, args, kwargs = META_CASES[case]
    name = case.split(" ")[0]
    flat = lambda out: [out] if isinstance(out, torch.Tensor) else [t for t in out]  # noqa: E731
    official = [(tuple(t.shape), t.dtype) for t in flat(_official(name, *args("cpu"), **kwargs))]
    for device in ("cpu", "meta"):
        kw = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
        ours = [(tuple(t.shape), t.dtype) for t in flat(op(*args(device), **kw))]
        assert ours == official, (device, ours, official)
