"""The plugin's MoE method: routing plans against vLLM's own router math, a whole layer
against an explicit float64 loop, refusals, registration (expert parallelism: test_expert_parallel.py)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from vllm.model_executor.layers.fused_moe.router import cpu_router

from vllm_ascend_ext.errors import AscendExtError
from vllm_ascend_ext.moe import experts
from vllm_ascend_ext.moe.method import layer_routing_plan
from vllm_ascend_ext.moe.routing import GATING, SOFTMAX, UnsupportedMoEError, plan_routing
from vllm_ascend_ext.ops.counting import OpCounter

E = 32
CONFIGS = {  # name: (scoring, renormalize, grouped, groups, kept, bias, scaling, top_k)
    "deepseek_v3": ("sigmoid", True, True, 8, 4, True, 2.5, 8),
    "deepseek_one_group": ("sigmoid", True, True, 1, 1, True, 1.0, 2),
    "sigmoid_not_renormalized": ("sigmoid", False, True, 4, 2, True, 1.5, 4),
    "softmax_grouped": ("softmax", False, True, 4, 2, False, 1.0, 6),
    "softmax_grouped_renormalized": ("softmax", True, True, 4, 2, False, 16.0, 6),
    "qwen_softmax_renormalized": ("softmax", True, False, None, None, False, 1.0, 4),
    "qwen_softmax": ("softmax", False, False, None, None, False, 1.0, 8),
}


def _plan(name):
    scoring, renorm, grouped, groups, kept, bias, scaling, k = CONFIGS[name]
    return plan_routing(layer_name=name, top_k=k, num_experts=E, scoring_func=scoring,
                        renormalize=renorm, use_grouped_topk=grouped, num_expert_group=groups,
                        topk_group=kept, has_bias=bias, routed_scaling_factor=scaling)


def _vllm_routing(name, logits, bias):
    """vLLM's CPU router math (the path the emulated platform replaced)."""
    scoring, renorm, grouped, groups, kept, has_bias, scaling, k = CONFIGS[name]
    if grouped:
        return cpu_router._grouped_topk(logits, k, renorm, groups, kept, scoring, scaling,
                                        bias if has_bias else None)
    return cpu_router._softmax_topk(logits, k, renorm)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_routing_matches_vllms_router_for_every_variant(name):
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(9, E, generator=g) * 3
    bias = torch.randn(E, generator=g) * 0.5
    plan = _plan(name)
    assert plan.op == (SOFTMAX if name.startswith("qwen") else GATING)
    weights, ids = experts.route(plan, logits, bias)
    want_w, want_ids = _vllm_routing(name, logits, bias)
    for t in range(logits.shape[0]):   # vLLM returns experts unsorted: compare as maps
        got = dict(zip(ids[t].tolist(), weights[t].tolist()))
        want = dict(zip(want_ids[t].tolist(), want_w[t].tolist()))
        assert got.keys() == want.keys(), (t, got, want)
        for e in got:
            assert got[e] == pytest.approx(want[e], rel=1e-5, abs=1e-7)


def test_ignoring_the_bias_or_the_groups_changes_the_routing():
    """Negative controls for the comparison above."""
    g = torch.Generator().manual_seed(7)
    logits, bias = torch.randn(9, E, generator=g) * 3, torch.randn(E, generator=g) * 0.5
    want_w, want_ids = _vllm_routing("deepseek_v3", logits, bias)
    plan = _plan("deepseek_v3")
    no_bias = experts.route(plan, logits, torch.zeros(E))[1]
    one_group = experts.route(_plan("deepseek_one_group").__class__(
        **{**plan.__dict__, "group_count": 1, "k_group": 1}), logits, bias)[1]
    for ids in (no_bias, one_group):
        assert any(set(ids[t].tolist()) != set(want_ids[t].tolist()) for t in range(9))


def _ffn_loop(x, w13, w2, e):
    """FFN of expert ``e`` on one token, element by element (vLLM's [E, N, K] layout)."""
    inter = w2.shape[2]
    h = [sum(x[i] * w13[e, r, i].item() for i in range(len(x))) for r in range(2 * inter)]
    act = [h[r] / (1 + math.exp(-h[r])) * h[inter + r] for r in range(inter)]
    return [sum(act[r] * w2[e, c, r].item() for r in range(inter)) for c in range(w2.shape[1])]


@pytest.mark.parametrize("name", ["deepseek_v3", "qwen_softmax_renormalized"])
def test_a_whole_layer_matches_a_per_token_per_expert_loop(name):
    g = torch.Generator().manual_seed(3)
    tokens, hidden, inter = 6, 8, 4
    x = torch.randn(tokens, hidden, generator=g, dtype=torch.float64)
    logits = torch.randn(tokens, E, generator=g, dtype=torch.float64)
    bias = torch.randn(E, generator=g, dtype=torch.float64) * 0.3
    w13 = torch.randn(E, 2 * inter, hidden, generator=g, dtype=torch.float64) / 3  # vLLM layout
    w2 = torch.randn(E, hidden, inter, generator=g, dtype=torch.float64) / 2
    plan = _plan(name)
    weights, ids = experts.route(plan, logits, bias)
    out = experts.routed_experts(x, weights, ids, w13.transpose(1, 2).contiguous(),
                                 w2.transpose(1, 2).contiguous())
    want_w, want_ids = _vllm_routing(name, logits, bias)
    for t in range(tokens):
        acc = [0.0] * hidden
        for w, e in zip(want_w[t].tolist(), want_ids[t].tolist()):
            acc = [a + w * v for a, v in zip(acc, _ffn_loop(x[t].tolist(), w13, w2, e))]
        assert out[t].tolist() == pytest.approx(acc, rel=1e-5, abs=1e-8)


def test_a_layers_operator_calls_do_not_grow_with_experts_or_tokens():
    def count(tokens, num_experts, name):
        g = torch.Generator().manual_seed(0)
        plan = plan_routing(layer_name="l", top_k=4, num_experts=num_experts,
                            scoring_func=CONFIGS[name][0], renormalize=True,
                            use_grouped_topk=CONFIGS[name][2], num_expert_group=4 if CONFIGS[name][2] else None,
                            topk_group=2, has_bias=CONFIGS[name][5], routed_scaling_factor=1.0)
        x, logits = torch.randn(tokens, 8, generator=g), torch.randn(tokens, num_experts, generator=g)
        w13, w2 = torch.randn(num_experts, 8, 8), torch.randn(num_experts, 4, 8)
        with OpCounter() as c:
            experts.routed_experts(x, *experts.route(plan, logits, torch.zeros(num_experts)), w13, w2)
        return tuple(sorted(c.total().items()))

    for name in ("deepseek_v3", "qwen_softmax_renormalized"):
        counts = {count(t, e, name) for t in (1, 7, 33) for e in (16, 64)}
        assert len(counts) == 1, (name, counts)


def _layer(**over):
    moe = SimpleNamespace(is_act_and_mul=True, has_bias=False, has_hash_routing=False,
                          is_lora_enabled=False)
    layer = SimpleNamespace(layer_name="model.layers.3.mlp.experts", moe_config=moe,
                            activation=SimpleNamespace(value="silu"), apply_router_weight_on_input=False,
                            expert_map=None, top_k=2, global_num_experts=8, scoring_func="softmax",
                            renormalize=True, use_grouped_topk=False, num_expert_group=None,
                            topk_group=None, e_score_correction_bias=None,
                            routed_scaling_factor=1.0, custom_routing_function=None,
                            swiglu_limit=None, swiglu_alpha=None, swiglu_beta=None)
    for key, value in over.items():
        target = moe if key in vars(moe) else layer
        setattr(target, key, value)
    return layer


@pytest.mark.parametrize("over,message", [
    (dict(custom_routing_function=lambda **kw: None), "custom routing function"),
    (dict(scoring_func="sqrtsoftplus"), "scoring_func='sqrtsoftplus'"),
    (dict(activation=SimpleNamespace(value="gelu")), "activation is 'gelu'"),
    (dict(has_bias=True), "expert biases"),
    (dict(has_hash_routing=True), "hash routing"),
    (dict(apply_router_weight_on_input=True), "applied to the input"),
    (dict(use_grouped_topk=True, num_expert_group=4, topk_group=2), "more than 2 experts per group"),
    (dict(use_grouped_topk=True, num_expert_group=3, topk_group=1), "not an even split"),
    (dict(use_grouped_topk=True, num_expert_group=2, topk_group=None), "without topk_group"),
    (dict(swiglu_limit=7.0), "clamps or scales it \\(swiglu_limit=7.0\\)"),
    (dict(is_lora_enabled=True), "LoRA"),
    (dict(global_num_experts=1025, top_k=2), "at most 1024 groups"),
])
def test_unsupported_layers_are_refused_naming_the_layer_and_the_feature(over, message):
    with pytest.raises(UnsupportedMoEError, match=message) as err:
        layer_routing_plan(_layer(**over))
    assert "model.layers.3.mlp.experts" in str(err.value)
    assert isinstance(err.value, AscendExtError)


def test_plain_softmax_routing_takes_any_expert_count_the_softmax_kernel_takes():
    assert layer_routing_plan(_layer(global_num_experts=2, top_k=2)).op == SOFTMAX


def test_registration_replaces_vllms_unquantized_method_once(monkeypatch):
    from vllm.model_executor import custom_op

    from vllm_ascend_ext.moe import method

    monkeypatch.setattr(custom_op, "op_registry_oot", {})
    method.register()
    method.register()   # idempotent
    assert custom_op.op_registry_oot == {"UnquantizedFusedMoEMethod": method.AscendFusedMoEMethod}
    custom_op.op_registry_oot["UnquantizedFusedMoEMethod"] = object
    with pytest.raises(RuntimeError, match="already replaced"):
        method.register()


def _quantized_row(values):
    """npu_dynamic_quant of one row, by hand: symmetric int8, scale = max|v| / 127."""
    scale = max(abs(v) for v in values) / 127
    return [max(-128, min(127, round(v / scale))) if scale else 0 for v in values], scale


def test_w8a8_experts_match_a_per_token_loop_with_per_row_quantisation():
    g = torch.Generator().manual_seed(5)
    tokens, hidden, inter, num = 5, 8, 4, 6
    x = torch.randn(tokens, hidden, generator=g)
    w13 = torch.randint(-127, 128, (num, 2 * inter, hidden), generator=g, dtype=torch.int8)
    w2 = torch.randint(-127, 128, (num, hidden, inter), generator=g, dtype=torch.int8)
    s13, s2 = torch.rand(num, 2 * inter, generator=g) / 50, torch.rand(num, hidden, generator=g) / 50
    ids = torch.tensor([[0, 3], [3, 5], [1, 0], [5, 2], [3, 1]], dtype=torch.int32)
    weights = torch.rand(tokens, 2, generator=g)
    out = experts.routed_experts_w8a8(x, weights, ids, w13.transpose(1, 2).contiguous(), s13,
                                      w2.transpose(1, 2).contiguous(), s2)
    for t in range(tokens):
        acc = [0.0] * hidden
        for k in range(2):
            e = int(ids[t, k])
            q, sx = _quantized_row(x[t].tolist())
            h = [sum(q[i] * int(w13[e, n, i]) for i in range(hidden)) * s13[e, n].item() * sx
                 for n in range(2 * inter)]
            act = [h[r] / (1 + math.exp(-h[r])) * h[inter + r] for r in range(inter)]
            qa, sa = _quantized_row(act)
            down = [sum(qa[r] * int(w2[e, c, r]) for r in range(inter)) * s2[e, c].item() * sa
                    for c in range(hidden)]
            acc = [a + weights[t, k].item() * d for a, d in zip(acc, down)]
        assert out[t].tolist() == pytest.approx(acc, rel=1e-4, abs=1e-5)
