"""npu_dequant_swiglu_quant (reference, meta, rules) and the W8A8 MLP whose activation is
that one launch (layers/w8a8_mlp.py), against explicit float64 loops and a dense MLP."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.model_executor.layers.activation import SiluAndMul

from vllm_ascend_ext.contract import docs, op_rules, product_gaps
from vllm_ascend_ext.contract.layer_op_rules import LAYER_OP_RULES
from vllm_ascend_ext.contract.rules import Call
from vllm_ascend_ext.layers import w8a8_mlp
from vllm_ascend_ext.layers.routes import FUSED, NATIVE
from vllm_ascend_ext.ops.counting import OpCounter
from vllm_ascend_ext.ops.dequant_swiglu_quant import (
    dequant_swiglu_quant_meta,
    dequant_swiglu_quant_reference,
    npu_dequant_swiglu_quant,
)
from vllm_ascend_ext.quantization import w8a8_dynamic

DSQ = "npu_dequant_swiglu_quant"


def _loop(x, *, ws=None, act=None, bias=None, qs=None, counts=None, left=True):
    """Explicit float64 loops over rows and channels: dequant, SwiGLU, smooth, quant."""
    rows, width = x.shape
    h = width // 2
    counts = [rows] if counts is None else counts
    y = torch.zeros(rows, h, dtype=torch.int8)
    scale = torch.zeros(rows, dtype=torch.float64)
    r = 0
    for g, count in enumerate(counts):
        for _ in range(count):
            vals = []
            for j in range(width):
                v = float(x[r, j]) + (float(bias[j]) if bias is not None else 0.0)
                if ws is not None:
                    v *= float(ws[g, j]) * float(act.reshape(-1)[r])
                vals.append(v)
            a = []
            for j in range(h):
                gate, up = (vals[j], vals[h + j]) if left else (vals[h + j], vals[j])
                out = gate / (1.0 + math.exp(-gate)) * up
                a.append(out * (float(qs[g, j]) if qs is not None else 1.0))
            s = max(abs(v) for v in a) / 127.0
            scale[r] = s
            for j in range(h):
                y[r, j] = max(-128, min(127, round(a[j] / s))) if s else 0
            r += 1
    return y, scale


def _close(got, expected):
    y, s = got
    y_ref, s_ref = expected
    assert y.dtype == torch.int8 and s.dtype == torch.float32
    assert (y.int() - y_ref.int()).abs().max() <= 1          # a rounding boundary at most
    assert (y != y_ref).float().mean() < 0.05
    torch.testing.assert_close(s.double(), s_ref, rtol=1e-5, atol=0)


def _int32_case(g, rows=6, h=16, groups=1):
    x = torch.randint(-3000, 3000, (rows, 2 * h), generator=g, dtype=torch.int32)
    ws = torch.rand(groups, 2 * h, generator=g) * 1e-3 + 1e-4
    act = torch.rand(rows, generator=g) * 1e-2 + 1e-3
    return x, ws, act


@pytest.mark.parametrize("left", [True, False])
def test_int32_dequant_swiglu_quant_matches_float64_loops(left):
    g = torch.Generator().manual_seed(1)
    x, ws, act = _int32_case(g)
    got = npu_dequant_swiglu_quant(x, weight_scale=ws, activation_scale=act, activate_left=left,
                                   quant_mode=1)
    _close(got, _loop(x, ws=ws, act=act, left=left))
    bias = torch.randint(-500, 500, (x.shape[1],), generator=g, dtype=torch.int32)
    got = dequant_swiglu_quant_reference(x, weight_scale=ws, activation_scale=act, bias=bias,
                                         activate_left=left, quant_mode=1)
    _close(got, _loop(x, ws=ws, act=act, bias=bias, left=left))


def test_groups_smooth_scales_and_bf16_input_match_float64_loops():
    g = torch.Generator().manual_seed(2)
    x, ws, act = _int32_case(g, rows=7, groups=3)
    qs = torch.rand(3, 16, generator=g) + 0.5
    counts = torch.tensor([2, 0, 4])                      # one row past the sum: zeros
    got = dequant_swiglu_quant_reference(x, weight_scale=ws, activation_scale=act, quant_scale=qs,
                                         group_index=counts, activate_left=True, quant_mode=1)
    _close(got, _loop(x, ws=ws, act=act, qs=qs, counts=[2, 0, 4]))
    assert got[0][6].abs().sum() == 0 and got[1][6] == 0
    xb = (torch.randn(5, 32, generator=g) * 3).bfloat16()
    _close(npu_dequant_swiglu_quant(xb, activate_left=True, quant_mode=1),
           _loop(xb.double(), left=True))


def test_meta_shapes_equal_the_reference_and_bad_calls_are_refused():
    g = torch.Generator().manual_seed(3)
    x, ws, act = _int32_case(g)
    kw = dict(weight_scale=ws, activation_scale=act, activate_left=True, quant_mode=1)
    ref = dequant_swiglu_quant_reference(x, **kw)
    meta = dequant_swiglu_quant_meta(x.to("meta"), weight_scale=ws.to("meta"),
                                     activation_scale=act.to("meta"), activate_left=True,
                                     quant_mode=1)
    assert [(t.shape, t.dtype) for t in ref] == [(t.shape, t.dtype) for t in meta]
    with pytest.raises(ValueError, match="needs weight_scale and activation_scale"):
        npu_dequant_swiglu_quant(x, weight_scale=ws, quant_mode=1)
    with pytest.raises(ValueError, match=r"weight_scale must be fp32 \[1, 32\]"):
        npu_dequant_swiglu_quant(x, weight_scale=ws[:, :16], activation_scale=act, quant_mode=1)
    with pytest.raises(ValueError, match="must be None"):
        npu_dequant_swiglu_quant(x.bfloat16(), weight_scale=ws, quant_mode=1)
    with pytest.raises(ValueError, match="even last dim"):
        npu_dequant_swiglu_quant(x[:, :31], weight_scale=ws[:, :31], activation_scale=act,
                                 quant_mode=1)
    with pytest.raises(NotImplementedError, match="static"):
        npu_dequant_swiglu_quant(x, **{**kw, "quant_mode": 0})
    with pytest.raises(ValueError, match="counts summing"):
        dequant_swiglu_quant_reference(x, weight_scale=ws.expand(2, -1).contiguous(),
                                       activation_scale=act, group_index=torch.tensor([4, 4]),
                                       quant_mode=1)


# The MLP ------------------------------------------------------------------------------

class _Linear(nn.Module):
    """A W8A8 dynamic linear as the plugin's method leaves it after loading (TP 1)."""

    def __init__(self, k, n, g, scale):
        super().__init__()
        self.quant_method = w8a8_dynamic.W8A8DynamicLinearMethod("test")
        self.weight = torch.randint(-127, 128, (k, n), generator=g, dtype=torch.int8)
        self.weight_scale = torch.rand(n, generator=g) * scale + scale / 4
        self.bias = None
        self.reduce_results, self.tp_size, self.input_is_parallel = False, 1, True

    def dense(self):
        return self.weight.double() * self.weight_scale.double()

    def forward(self, x):
        return self.quant_method.apply(self, x), None


@pytest.fixture(scope="module")
def mlp():
    g = torch.Generator().manual_seed(4)
    hidden, inter = 64, 48
    m = nn.Module()
    m.gate_up_proj = _Linear(hidden, 2 * inter, g, 2.0 / (127 * math.sqrt(hidden)))
    m.down_proj = _Linear(inter, hidden, g, 2.0 / (127 * math.sqrt(inter)))
    with set_current_vllm_config(VllmConfig()):
        m.act_fn = SiluAndMul()
    return m


def _dense(m, x):
    h = x.double() @ m.gate_up_proj.dense()
    gate, up = h.chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up) @ m.down_proj.dense()


def test_fused_mlp_matches_a_dense_float64_mlp_in_four_launches(mlp):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(9, 64, generator=g).bfloat16()
    with OpCounter() as c:
        out = w8a8_mlp.w8a8_mlp(mlp, x)
    assert {k: v for k, v in c.total().items() if k.startswith("npu_")} == {
        "npu_dynamic_quant": 1, "npu_quant_matmul": 2, "npu_dequant_swiglu_quant": 1}
    assert out.dtype == torch.bfloat16 and out.shape == (9, 64)
    expected = _dense(mlp, x)
    err = float((out.double() - expected).abs().max() / expected.abs().max())
    assert err < 0.03, err
    # the unfused chain (vLLM's MLP forward over the W8A8 method) agrees as closely
    unfused = mlp.down_proj(mlp.act_fn(mlp.gate_up_proj(x)[0]))[0]
    assert float((unfused.double() - expected).abs().max() / expected.abs().max()) < 0.03
    # negative control: SwiGLU over the wrong half (activate_left=False) is far off
    xq, sx = w8a8_dynamic.npu_dynamic_quant(x)
    acc = w8a8_dynamic.npu_quant_matmul(xq, mlp.gate_up_proj.weight,
                                        mlp.gate_up_proj.weight_scale, output_dtype=torch.int32)
    yq, ys = npu_dequant_swiglu_quant(acc, weight_scale=mlp.gate_up_proj.weight_scale[None],
                                      activation_scale=sx, activate_left=False, quant_mode=1)
    bad = w8a8_dynamic.apply_prequantized(mlp.down_proj, yq, ys, torch.bfloat16)
    assert float((bad.double() - expected).abs().max() / expected.abs().max()) > 10 * err


def test_the_int32_gemm_is_the_raw_accumulation(mlp):
    g = torch.Generator().manual_seed(6)
    xq = torch.randint(-127, 128, (3, 64), generator=g, dtype=torch.int8)
    acc = w8a8_dynamic.npu_quant_matmul(xq, mlp.gate_up_proj.weight,
                                        mlp.gate_up_proj.weight_scale, output_dtype=torch.int32)
    assert acc.dtype == torch.int32
    assert torch.equal(acc.long(), xq.long() @ mlp.gate_up_proj.weight.long())


def test_route_and_shape_gate(mlp):
    assert w8a8_mlp.w8a8_mlp_route("A2", "fused")[0] == FUSED
    assert w8a8_mlp.w8a8_mlp_route("A3", "fused")[0] == FUSED
    route, why = w8a8_mlp.w8a8_mlp_route("A5", "fused")
    assert route == NATIVE and "A2/A3" in why
    assert w8a8_mlp.w8a8_mlp_route("A2", "native")[0] == NATIVE
    assert w8a8_mlp.w8a8_mlp_route(None, "fused")[0] == NATIVE
    assert w8a8_mlp.takes_fused_w8a8_mlp(mlp, "fused", "A2")
    assert not w8a8_mlp.takes_fused_w8a8_mlp(mlp, "fused", "A5")
    no_act = nn.Module()
    no_act.gate_up_proj, no_act.down_proj = mlp.gate_up_proj, mlp.down_proj
    no_act.act_fn = nn.GELU()
    assert not w8a8_mlp.fusable_w8a8_mlp(no_act)
    float_down = nn.Module()
    float_down.gate_up_proj, float_down.act_fn = mlp.gate_up_proj, mlp.act_fn
    float_down.down_proj = nn.Linear(48, 64, bias=False)
    assert not w8a8_mlp.fusable_w8a8_mlp(float_down)


def test_fused_mlp_passes_contract_mode_on_a2(contract, mlp):
    h = contract("ascend910b2")
    w8a8_mlp.w8a8_mlp(mlp, torch.randn(5, 64).bfloat16())
    assert h.violations == 0, h.summary()
    assert {"npu_dynamic_quant", "npu_quant_matmul", DSQ} <= set(h.calls)
    assert product_gaps.route(DSQ, "A5").startswith("not called there")
    assert product_gaps.route(DSQ, "A2") is None


# Rules --------------------------------------------------------------------------------

def _problems(op, rules, **values):
    call = Call(op=op, values=values, soc="ascend910b2", family="A2", mutable=())
    return [r.argument for r in rules if r.op == op and r.check(call)]


def test_contract_rules_flag_bad_calls_and_pass_good_ones():
    g = torch.Generator().manual_seed(7)
    x, ws, act = _int32_case(g)
    good = dict(x=x, weight_scale=ws, activation_scale=act, bias=None, quant_scale=None,
                quant_offset=None, group_index=None, activate_left=True, quant_mode=1)

    def problems(**over):
        return _problems(DSQ, LAYER_OP_RULES, **{**good, **over})

    assert problems() == []
    assert problems(activation_scale=None) == ["activation_scale"]
    assert problems(activation_scale=act[:, None]) == []          # the docs' example shape
    assert problems(activation_scale=act[:3]) == ["activation_scale"]
    assert problems(weight_scale=ws.double()) == ["weight_scale"]
    assert problems(x=x.bfloat16()) == ["x"]                     # scales given with bf16 x
    assert problems(x=x.bfloat16(), weight_scale=None, activation_scale=None) == []
    assert problems(x=x.to(torch.float16), weight_scale=None, activation_scale=None) == ["x"]
    assert problems(quant_mode=2) == ["quant_mode"]
    counts = torch.tensor([6])
    assert problems(group_index=counts, quant_mode=0) == ["group_index", "group_index"]
    wide = torch.randint(-9, 9, (6, 256), dtype=torch.int32)
    assert problems(x=wide, weight_scale=torch.rand(1, 256), group_index=counts) == []
    assert problems(group_index=counts) == ["group_index"]       # H=16 is not 64-aligned
    for rule in LAYER_OP_RULES:
        if rule.op == DSQ:
            assert rule.quote in docs.line(DSQ, rule.quote)
    # npu_quant_matmul's int32 output takes no per-token scale (its combination table)
    qmm = dict(x1=torch.zeros(2, 8, dtype=torch.int8), x2=torch.zeros(8, 4, dtype=torch.int8),
               scale=torch.ones(4), pertoken_scale=None, bias=None, output_dtype=torch.int32)
    assert _problems("npu_quant_matmul", op_rules.NORM_QUANT_RULES, **qmm) == []
    assert _problems("npu_quant_matmul", op_rules.NORM_QUANT_RULES,
                     **{**qmm, "pertoken_scale": torch.ones(2)}) == ["output_dtype"]
    assert _problems("npu_quant_matmul", op_rules.NORM_QUANT_RULES,
                     **{**qmm, "scale": torch.ones(4, dtype=torch.int64)}) == ["output_dtype"]


@pytest.mark.parametrize("reduce_results", [True, False])
def test_down_proj_partial_sums_are_all_reduced_once_under_tensor_parallelism(
        mlp, monkeypatch, reduce_results):
    """As RowParallelLinear.forward: one all-reduce of the partial sums when down_proj
    reduces its results and tensor parallelism is on, none otherwise (the shared expert's
    down_proj does not: vLLM's fused-MoE layer reduces routed + shared once)."""
    import vllm.distributed

    calls = []

    def all_reduce(t):          # the other rank holding the same partial sum
        calls.append(t.shape)
        return t * 2

    monkeypatch.setattr(vllm.distributed, "tensor_model_parallel_all_reduce", all_reduce)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(8)).bfloat16()
    single = w8a8_mlp.w8a8_mlp(mlp, x)
    assert calls == []                           # tp_size 1: nothing to reduce
    monkeypatch.setattr(mlp.down_proj, "tp_size", 2)
    monkeypatch.setattr(mlp.down_proj, "reduce_results", reduce_results)
    out = w8a8_mlp.w8a8_mlp(mlp, x)
    assert len(calls) == (1 if reduce_results else 0)
    assert torch.equal(out, single * 2 if reduce_results else single)
