"""The SFA preprocessing route: every row of the rule, overrides and their errors."""

from __future__ import annotations

import pytest

from vllm_ascend_ext.attention.sfa.route import LayerFacts, SfaRouteError, decide

DEPLOYMENTS = ("none", "kv_producer", "kv_consumer", "kv_both")


@pytest.mark.parametrize("role", DEPLOYMENTS)
@pytest.mark.parametrize("quant,soc", [("w8a8_dynamic", "A2"), ("w8a8_dynamic", "A3"),
                                       ("w8a8_dynamic", "A5"), ("mxfp8", "A5")])
def test_quantized_layers_take_the_prolog_in_every_deployment(quant, soc, role):
    r = decide(LayerFacts(quant=quant, kv_role=role, soc_family=soc))
    assert r.preprocess == "prolog_v3" and quant in r.reason
    # the route is per layer, so it holds for prefill, decode and mixed steps alike;
    # the native chain never runs there, so its weights go in every deployment
    assert r.dispose_fallback


@pytest.mark.parametrize("role,route", [("none", "native"), ("kv_producer", "native"),
                                        ("kv_both", "native"), ("kv_consumer", "prolog_v3")])
def test_unquantized_layers_keep_the_native_chain_except_on_kv_consumers(role, route):
    r = decide(LayerFacts(quant="float", kv_role=role))
    assert r.preprocess == route
    assert r.dispose_fallback == (route == "prolog_v3")


@pytest.mark.parametrize("quant", ["float", "w8a8_dynamic", "mxfp8"])
@pytest.mark.parametrize("role", DEPLOYMENTS)
def test_prefill_context_parallel_excludes_the_fused_route(quant, role):
    r = decide(LayerFacts(quant=quant, kv_role=role, prefill_cp=True, soc_family="A5"))
    assert r.preprocess == "native" and "context parallel" in r.reason
    assert not r.dispose_fallback
    with pytest.raises(SfaRouteError, match="prolog_v3.*context parallel"):
        decide(LayerFacts(quant=quant, kv_role=role, prefill_cp=True, soc_family="A5"),
               "prolog_v3")


@pytest.mark.parametrize("quant", ["float", "w8a8_dynamic"])
@pytest.mark.parametrize("role", DEPLOYMENTS)
def test_kv_cache_quant_only_chooses_the_cache_layout(quant, role):
    plain = decide(LayerFacts(quant=quant, kv_role=role))
    c8 = decide(LayerFacts(quant=quant, kv_role=role, kv_cache_quant="c8"))
    assert (c8.preprocess, c8.dispose_fallback) == (plain.preprocess, plain.dispose_fallback)
    assert c8.cache_layout != plain.cache_layout and "C8" in c8.cache_layout


def test_mxfp8_needs_a_soc_with_fp8_prolog():
    r = decide(LayerFacts(quant="mxfp8", soc_family="A3"))
    assert r.preprocess == "native" and "A5" in r.reason
    with pytest.raises(SfaRouteError, match="MXFP8"):
        decide(LayerFacts(quant="mxfp8", soc_family="A3"), "prolog_v3")


def test_partially_quantized_prolog_weights_cannot_fuse():
    assert decide(LayerFacts(quant="mixed")).preprocess == "native"
    with pytest.raises(SfaRouteError, match="only part of the prolog weights"):
        decide(LayerFacts(quant="mixed"), "prolog_v3")


@pytest.mark.parametrize("quant", ["float", "w8a8_dynamic"])
@pytest.mark.parametrize("role", DEPLOYMENTS)
def test_overrides(quant, role):
    native = decide(LayerFacts(quant=quant, kv_role=role), "native")
    assert native.preprocess == "native" and "forced" in native.reason
    assert not native.dispose_fallback
    forced = decide(LayerFacts(quant=quant, kv_role=role), "prolog_v3")
    assert forced.preprocess == "prolog_v3"
    assert forced.dispose_fallback              # the native chain never runs there


def test_bad_values_name_the_field():
    with pytest.raises(ValueError, match="kv_role='consumer'"):
        decide(LayerFacts(quant="float", kv_role="consumer"))
    with pytest.raises(ValueError, match="sfa.preprocess='fused'"):
        decide(LayerFacts(quant="float"), "fused")


# ---- which fused prolog operator (csrc issue): torch_npu's v3 or the plugin's K3 ----
from vllm_ascend_ext.attention.sfa.route import PROLOG_V3, PROLOG_V3_K3, prolog_op  # noqa: E402


@pytest.mark.parametrize("rope_dim,kv_quant,quant,op", [
    (64, "none", "float", PROLOG_V3),            # ordinary MLA / SFA
    (64, "c8", "w8a8_dynamic", PROLOG_V3),       # SFA with the C8 per-tile KV mode
    (64, "none", "w8a8_dynamic", PROLOG_V3),
    (0, "none", "float", PROLOG_V3_K3),          # no RoPE dims: the plugin's own op
    (0, "c8", "float", None),                    # K3 has no KV-cache quant mode
    (0, "none", "w8a8_dynamic", None),           # K3 has no weight-quant mode
])
def test_prolog_operator_choice(rope_dim, kv_quant, quant, op):
    chosen, reason = prolog_op(rope_dim, kv_quant, quant)
    assert chosen == op and reason
    if op == PROLOG_V3_K3:
        assert "qk_rope_head_dim=0" in reason
    if kv_quant == "c8" and op == PROLOG_V3:
        assert "C8" in reason


def test_routes_carry_their_prolog_operator():
    assert decide(LayerFacts(quant="w8a8_dynamic")).prolog_op == PROLOG_V3
    assert decide(LayerFacts(quant="float", kv_role="kv_consumer", rope_dim=0)).prolog_op \
        == PROLOG_V3_K3
    assert decide(LayerFacts(quant="float")).prolog_op is None          # native chain
    r = decide(LayerFacts(quant="float", kv_role="kv_consumer", rope_dim=0, kv_cache_quant="c8"))
    assert r.preprocess == "native" and "C8" in r.reason
    with pytest.raises(SfaRouteError, match="no C8 KV-cache mode"):
        decide(LayerFacts(quant="float", rope_dim=0, kv_cache_quant="c8"), "prolog_v3")
