"""vllm-ascend's single-device W8A8 dynamic MoE sequence: ``npu_moe_init_routing_v2`` with
``quant_mode=1``, ``npu_grouped_matmul_swiglu_quant``, the int8 ``npu_grouped_matmul``,
``npu_moe_token_unpermute``. The references against explicit float64 loops written here,
their metas against the references (and torch-npu 2.13's official metas in contract mode),
the fused routed experts against the unfused ones and against a dense float MoE, with
negative controls, and the calls the fused path issues."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from vllm_ascend_ext.contract.harness import ContractViolation
from vllm_ascend_ext.moe import experts
from vllm_ascend_ext.moe.expert_shard import ExpertShard
from vllm_ascend_ext.moe.routing import SOFTMAX, RoutingPlan
from vllm_ascend_ext.moe.w8a8 import AscendW8A8FusedMoEMethod
from vllm_ascend_ext.ops.counting import OpCounter
from vllm_ascend_ext.ops.format import (
    ACL_FORMAT_FRACTAL_NZ,
    ACL_FORMAT_ND,
    npu_format,
    npu_format_cast,
)
from vllm_ascend_ext.ops.grouped_matmul import DTYPE_ENUM, npu_grouped_matmul
from vllm_ascend_ext.ops.grouped_matmul_swiglu_quant import (
    grouped_matmul_swiglu_quant_meta,
    grouped_matmul_swiglu_quant_reference,
    npu_grouped_matmul_swiglu_quant,
)
from vllm_ascend_ext.ops.moe_dispatch import (
    init_routing_v2_meta,
    init_routing_v2_reference,
    npu_moe_init_routing_v2,
    npu_moe_token_unpermute,
)
from vllm_ascend_ext.platform.soc import from_name
from vllm_ascend_ext.quantization.weight_format import quantized_weight_format


def _quant_row64(values: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Per-row symmetric int8 in float64: scale = max|v| / 127, q = round(v / scale)."""
    v = values.double()
    scale = v.abs().max().item() / 127
    if scale == 0:
        return torch.zeros_like(v), 0.0
    return torch.round(v / scale).clamp(-128, 127), scale


def _assert_quantized_close(q, scale, want_q, want_scale):
    """int8 rows equal up to one step where float32 and float64 round a tie differently."""
    assert q.dtype == torch.int8 and scale.dtype == torch.float32
    assert torch.allclose(scale.double(), want_scale, rtol=1e-6, atol=0)
    diff = (q.double() - want_q).abs()
    assert diff.max() <= 1 and (diff > 0).float().mean() < 0.01


def _routing_inputs(seed=0, n=9, h=32, k=3, e=8, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, h, generator=g) * torch.rand(n, 1, generator=g) * 4).to(dtype)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(n)]).int()
    return x, ids


# ------------------------------------------------------------ init_routing quant_mode=1
@pytest.mark.parametrize("span,smooth", [((0, 8), False), ((2, 6), False), ((2, 6), True)],
                         ids=["all-experts", "range", "range-smooth"])
def test_init_routing_dynamic_quant_rows_and_scales_match_a_float64_loop(span, smooth):
    x, ids = _routing_inputs()
    n, k = ids.shape
    start, end = span
    g = torch.Generator().manual_seed(3)
    scale = torch.rand(end - start, x.shape[1], generator=g) + 0.5 if smooth else None
    kw = dict(active_num=-1, expert_num=8, drop_pad_mode=0, expert_tokens_num_type=1,
              expert_tokens_num_flag=True, active_expert_range=span, row_idx_type=0)
    q, row_idx, counts, row_scale = npu_moe_init_routing_v2(x, ids, scale=scale, quant_mode=1, **kw)
    # The independent walk: pairs (token, k) numbered token-major, sorted by expert, stably.
    pairs = sorted(((int(ids[t, j]), t * k + j) for t in range(n) for j in range(k)
                    if start <= int(ids[t, j]) < end), key=lambda p: p[0])
    want_q = torch.zeros(n * k, x.shape[1], dtype=torch.float64)
    want_s = torch.zeros(n * k, dtype=torch.float64)
    want_idx = torch.full((n * k,), -1, dtype=torch.int32)
    for dst, (expert, src) in enumerate(pairs):
        row = x[src // k].double()
        if smooth:
            row = row * scale[expert - start].double()
        want_q[dst], want_s[dst] = _quant_row64(row)
        want_idx[src] = dst
    _assert_quantized_close(q, row_scale, want_q, want_s)
    assert torch.equal(row_idx, want_idx)
    assert counts.tolist() == [sum(p[0] == e for p in pairs) for e in range(start, end)]
    # The routing itself is quant_mode=-1's.
    plain_x, plain_idx, plain_counts, _ = npu_moe_init_routing_v2(x, ids, quant_mode=-1, **kw)
    assert torch.equal(plain_idx, row_idx) and torch.equal(plain_counts, counts)
    # Dequantized rows are the routed rows (times the smooth scale) within half a step.
    valid = len(pairs)
    smoothed = plain_x[:valid].double()
    if smooth:
        smoothed = smoothed * scale[torch.tensor([p[0] - start for p in pairs])].double()
    err = (q[:valid].double() * row_scale[:valid, None].double() - smoothed).abs()
    assert (err <= row_scale[:valid, None].double() * 0.5 + 1e-6).all()


def test_init_routing_dynamic_quant_meta_equals_the_reference_and_refusals():
    x, ids = _routing_inputs(dtype=torch.float32)
    kw = dict(active_num=-1, expert_num=8, drop_pad_mode=0, expert_tokens_num_type=1,
              expert_tokens_num_flag=True, quant_mode=1, active_expert_range=(1, 7), row_idx_type=0)
    got = init_routing_v2_reference(x, ids, **kw)
    meta = init_routing_v2_meta(x.to("meta"), ids.to("meta"), **kw)
    on_meta = npu_moe_init_routing_v2(x.to("meta"), ids.to("meta"), **kw)   # the entry's pick
    assert [(t.shape, t.dtype) for t in got] == [(t.shape, t.dtype) for t in meta] \
        == [(t.shape, t.dtype) for t in on_meta]
    assert got[0].dtype == torch.int8 and got[3].dtype == torch.float32
    assert got[3].shape == (ids.numel(),)
    with pytest.raises(ValueError, match="int8 x takes quant_mode -1 only"):
        init_routing_v2_reference(x.to(torch.int8), ids, **kw)
    with pytest.raises(ValueError, match="no offset in dynamic quant mode"):
        init_routing_v2_reference(x, ids, offset=torch.zeros(6, 32), **kw)
    with pytest.raises(ValueError, match=r"must be \[6, 32\]"):
        init_routing_v2_reference(x, ids, scale=torch.ones(x.shape[0]), **kw)
    with pytest.raises(NotImplementedError, match="quant_mode 0"):
        init_routing_v2_reference(x, ids, **{**kw, "quant_mode": 0})


# ------------------------------------------------------- npu_grouped_matmul_swiglu_quant
def _gsq_inputs(seed=1, m=23, k=16, n=12, e=5):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
    w = torch.randint(-127, 128, (e, k, n), generator=g, dtype=torch.int8)
    w_scale = torch.rand(e, n, generator=g) / 100 + 1e-3
    x_scale = torch.rand(m, generator=g) / 10 + 1e-3
    sizes = [5, 0, 7, 3, 4]                     # an empty group; 4 dirty rows after the last
    group_list = torch.tensor(sizes, dtype=torch.int64).cumsum(0)
    return x, w, group_list, w_scale, x_scale


def _gsq_loop64(x, w, group_list, w_scale, x_scale, *, gate_first=True, with_x_scale=True):
    m, n = x.shape[0], w.shape[2]
    act = torch.zeros(m, n // 2, dtype=torch.float64)
    begin = 0
    for e, end in enumerate(group_list.tolist()):
        for r in range(begin, end):
            h = (x[r].double() @ w[e].double()) * w_scale[e].double()
            if with_x_scale:
                h = h * float(x_scale[r])
            a, b = h[: n // 2], h[n // 2:]
            gate, up = (a, b) if gate_first else (b, a)
            act[r] = gate / (1 + torch.exp(-gate)) * up
        begin = end
    qs, ss = zip(*(_quant_row64(row) for row in act))
    return torch.stack(qs), torch.tensor(ss, dtype=torch.float64), act


def test_grouped_matmul_swiglu_quant_matches_a_float64_per_expert_loop():
    inputs = _gsq_inputs()
    q, scale, offset = npu_grouped_matmul_swiglu_quant(*inputs)
    want_q, want_s, act = _gsq_loop64(*inputs)
    _assert_quantized_close(q, scale, want_q, want_s)
    rows = int(inputs[2][-1])
    assert not q[rows:].any() and not scale[rows:].any()       # dirty rows: zero here
    deq = q.double() * scale.double()[:, None]
    assert ((deq - act).abs() <= scale.double()[:, None] * 0.5 + 1e-9).all()
    assert offset.shape == () and offset.dtype == torch.float32
    # Negative controls: the other half as the gate, or without x_scale, is another result.
    for wrong in (dict(gate_first=False), dict(with_x_scale=False)):
        other_q, other_s, _ = _gsq_loop64(*inputs, **wrong)
        assert (other_q[:rows] * other_s[:rows, None] - deq[:rows]).abs().max() > 10 * scale.max()


def test_grouped_matmul_swiglu_quant_meta_equals_the_reference_and_refusals():
    inputs = _gsq_inputs()
    got = grouped_matmul_swiglu_quant_reference(*inputs)
    meta = grouped_matmul_swiglu_quant_meta(*(t.to("meta") for t in inputs))
    on_meta = npu_grouped_matmul_swiglu_quant(*(t.to("meta") for t in inputs))
    shapes = [(t.shape, t.dtype) for t in got]
    assert shapes == [(t.shape, t.dtype) for t in meta] == [(t.shape, t.dtype) for t in on_meta]
    assert shapes == [((23, 6), torch.int8), ((23,), torch.float32), ((), torch.float32)]
    x, w, group_list, w_scale, x_scale = inputs
    with pytest.raises(ValueError, match="reserved inputs"):
        grouped_matmul_swiglu_quant_reference(*inputs, bias=torch.zeros(5, 12, dtype=torch.int32))
    with pytest.raises(ValueError, match="group_list must be 1-D int64"):
        grouped_matmul_swiglu_quant_reference(x, w, group_list.int(), w_scale, x_scale)
    with pytest.raises(ValueError, match="non-decreasing running sums"):
        grouped_matmul_swiglu_quant_reference(x, w, group_list.flip(0), w_scale, x_scale)
    with pytest.raises(ValueError, match="x_scale must be fp32"):
        grouped_matmul_swiglu_quant_reference(x, w, group_list, w_scale, x_scale[:-1])


# ------------------------------------------------------------------ the routed experts
def _moe(seed=5, tokens=11, hidden=32, inter=16, num=6, top_k=2, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    w13 = torch.randint(-127, 128, (num, hidden, 2 * inter), generator=g, dtype=torch.int8)
    w2 = torch.randint(-127, 128, (num, inter, hidden), generator=g, dtype=torch.int8)
    s13 = torch.rand(num, 2 * inter, generator=g) / 200 + 1e-3
    s2 = torch.rand(num, hidden, generator=g) / 200 + 1e-3
    ids = torch.stack([torch.randperm(num, generator=g)[:top_k] for _ in range(tokens)]).int()
    weights = torch.softmax(torch.randn(tokens, top_k, generator=g), -1)
    return x, weights, ids, w13, s13, w2, s2


def _dense64(x, weights, ids, w13, s13, w2, s2, *, gate_first=True):
    """The float MoE the int8 weights stand for: no activation quantization, float64."""
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float64)
    inter = w2.shape[1]
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = x[t].double() @ (w13[e].double() * s13[e].double())
            a, b = h[:inter], h[inter:]
            gate, up = (a, b) if gate_first else (b, a)
            act = gate / (1 + torch.exp(-gate)) * up
            out[t] += float(weights[t, j]) * (act @ (w2[e].double() * s2[e].double()))
    return out


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _fused(x, weights, ids, w13, s13, w2, s2):
    return experts.routed_experts_w8a8_fused(x, weights, ids, npu_format_cast(w13, ACL_FORMAT_FRACTAL_NZ),
                                             s13, w2, s2)


def test_fused_experts_equal_the_unfused_ones_in_float32():
    """Float32 activations: the same roundings in the same order, bit for bit."""
    args = _moe(dtype=torch.float32)
    assert torch.equal(_fused(*args), experts.routed_experts_w8a8(*args))


def test_fused_experts_match_the_unfused_ones_and_a_dense_float_moe_in_bf16():
    args = _moe()
    fused, unfused = _fused(*args), experts.routed_experts_w8a8(*args)
    dense = _dense64(*args)
    assert fused.dtype == torch.bfloat16 and fused.shape == args[0].shape
    # The unfused path rounds gate_up and swiglu's output to bf16 before re-quantizing.
    assert _rel(fused, unfused) < 0.01
    # Int8 activations (two per-row quantizations) against the float MoE.
    assert _rel(fused, dense) < 0.03 and _rel(unfused, dense) < 0.03
    # Negative controls: the wrong half as the gate, or the routing's row scales dropped.
    assert _rel(fused, _dense64(*args, gate_first=False)) > 0.3
    x, weights, ids, w13, s13, w2, s2 = args
    rows, row_idx, counts, row_scale = npu_moe_init_routing_v2(
        x, ids, expert_num=w13.shape[0], expert_tokens_num_type=1, expert_tokens_num_flag=True,
        quant_mode=1, active_expert_range=(0, w13.shape[0]))
    act, act_scale, _ = npu_grouped_matmul_swiglu_quant(rows, w13, counts.cumsum(0), s13,
                                                        torch.ones_like(row_scale))
    down = npu_grouped_matmul([act], [w2], scale=[s2], per_token_scale=[act_scale],
                              group_list=counts, group_list_type=1,
                              output_dtype=DTYPE_ENUM[x.dtype])[0]
    no_x_scale = npu_moe_token_unpermute(down, row_idx, probs=weights)
    assert _rel(no_x_scale, dense) > 0.3


def test_fused_experts_issue_four_npu_calls_and_no_separate_quant_or_swiglu():
    args = _moe()
    w13_nz = npu_format_cast(args[3], ACL_FORMAT_FRACTAL_NZ)       # once, after loading
    with OpCounter() as c:
        experts.routed_experts_w8a8_fused(*args[:3], w13_nz, *args[4:])
    # Four launches, and the group sizes' running sum (vllm-ascend's cumsum_group_list).
    assert c.total() == {"npu_moe_init_routing_v2": 1, "npu_grouped_matmul_swiglu_quant": 1,
                         "npu_grouped_matmul": 1, "npu_moe_token_unpermute": 1,
                         "aten.cumsum": 1}, c.total()
    with OpCounter() as c:
        experts.routed_experts_w8a8(*args)
    assert c.total()["npu_dynamic_quant"] == 2 and c.total()["npu_swiglu"] == 1


def test_fused_experts_pass_contract_mode_with_nz_weights_and_not_with_nd(contract):
    h = contract("ascend910b2")
    args = _moe()
    _fused(*args)
    assert h.violations == 0, h.summary()
    assert {"npu_moe_init_routing_v2", "npu_grouped_matmul_swiglu_quant", "npu_grouped_matmul",
            "npu_moe_token_unpermute"} <= set(h.calls)
    with pytest.raises(ContractViolation, match=r"npu_grouped_matmul_swiglu_quant: argument "
                                                r"weight: format ND"):
        experts.routed_experts_w8a8_fused(*args)


@pytest.mark.parametrize("name,setting,fused", [
    ("ascend910b2", "auto", True), ("ascend910_9391", "auto", True), ("ascend950", "auto", False),
    ("ascend910b2", "off", False)])
def test_the_w8a8_method_takes_the_fused_experts_with_nz_weights_only(name, setting, fused):
    """NZ experts (A2/A3) take the fused path; ND ones (950, or weight_nz="off") the unfused."""
    g = torch.Generator().manual_seed(1)
    e, k, n = 3, 8, 6
    layer = nn.Module()
    for stem, shape in (("w13", (e, 2 * n, k)), ("w2", (e, k, n))):
        layer.register_parameter(f"{stem}_weight", nn.Parameter(
            torch.randint(-127, 128, shape, generator=g, dtype=torch.int8), requires_grad=False))
        for suffix in ("weight_scale", "weight_offset"):
            layer.register_parameter(f"{stem}_{suffix}", nn.Parameter(
                torch.zeros(*shape[:2], 1), requires_grad=False))
    method = object.__new__(AscendW8A8FusedMoEMethod)      # only the weight hook is exercised
    method.prefix, method.dummy = "m.experts", False
    method.plan, method.shard = RoutingPlan(SOFTMAX, 2, e), ExpertShard(e, e)
    method.weight_format = quantized_weight_format(from_name(name).family, setting)
    method.process_weights_after_loading(layer)
    assert method.fused_experts is fused
    assert npu_format(layer.w13_weight) == (ACL_FORMAT_FRACTAL_NZ if fused else ACL_FORMAT_ND)
