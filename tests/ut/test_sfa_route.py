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
    # fallback weights go only on KV consumers
    assert r.dispose_fallback == (role == "kv_consumer")


@pytest.mark.parametrize("role,route", [("none", "native"), ("kv_producer", "native"),
                                        ("kv_both", "native"), ("kv_consumer", "prolog_v3")])
def test_unquantized_layers_keep_the_native_chain_except_on_kv_consumers(role, route):
    r = decide(LayerFacts(quant="float", kv_role=role))
    assert r.preprocess == route
    assert r.dispose_fallback == (role == "kv_consumer")


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
    assert forced.dispose_fallback == (role == "kv_consumer")


def test_bad_values_name_the_field():
    with pytest.raises(ValueError, match="kv_role='consumer'"):
        decide(LayerFacts(quant="float", kv_role="consumer"))
    with pytest.raises(ValueError, match="sfa.preprocess='fused'"):
        decide(LayerFacts(quant="float"), "fused")
