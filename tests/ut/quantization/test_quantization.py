"""ModelSlim description parsing, the W8A8 dynamic linear method, registration, auto-detect."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from vllm_ascend_ext.models import TINY_DSA_W8A8
from vllm_ascend_ext.quantization.description import (
    FILENAME,
    QuantDescriptionError,
    parse,
)
from vllm_ascend_ext.quantization.w8a8_dynamic import (
    W8A8DynamicLinearMethod,
    deterministic_int8,
)


def test_shipped_description_parses_keeps_kv_b_float_and_quantizes_experts():
    d = parse(json.loads((TINY_DSA_W8A8 / FILENAME).read_text()))
    assert d.model_quant_type == "W8A8_DYNAMIC"
    p = "model.layers.1."
    assert d.weight_type(p + "self_attn.q_a_proj") == "W8A8_DYNAMIC"
    assert d.weight_type(p + "self_attn.kv_b_proj") == "FLOAT"
    assert d.weight_type(p + "mlp.experts.0.gate_proj") == "W8A8_DYNAMIC"
    assert d.experts_type(p + "mlp.experts") == "W8A8_DYNAMIC"
    assert d.layer_type(p + "mlp.shared_experts.gate_up_proj", ("gate_proj", "up_proj")) \
        == "W8A8_DYNAMIC"
    assert d.layer_type(p + "self_attn.indexer.wk_weights_proj", ("wk", "weights_proj")) == "FLOAT"


def test_unknown_type_names_the_weight_and_the_type():
    with pytest.raises(QuantDescriptionError,
                       match=r"'model.layers.0.mlp.down_proj.weight' is 'W4A8_DYNAMIC'"):
        parse({"model_quant_type": "W4A8_DYNAMIC", "model.layers.0.mlp.down_proj.weight": "W4A8_DYNAMIC"})


def test_routed_experts_have_one_type_per_moe_layer_or_are_refused_by_name():
    raw = {f"model.layers.3.mlp.experts.{e}.{p}_proj.weight": "W8A8_DYNAMIC"
           for e in range(5) for p in ("gate", "up", "down")}
    d = parse(raw)
    assert d.experts_type("model.layers.3.mlp.experts") == "W8A8_DYNAMIC"
    assert d.experts_type("model.layers.4.mlp.experts") == "FLOAT"       # not listed
    raw["model.layers.3.mlp.experts.2.down_proj.weight"] = "FLOAT"
    with pytest.raises(QuantDescriptionError, match=r"experts of model\.layers\.3\.mlp\.experts "
                       r"mix types \(model\.layers\.3\.mlp\.experts\.0\.gate_proj\.weight: "
                       r"W8A8_DYNAMIC, model\.layers\.3\.mlp\.experts\.2\.down_proj\.weight: FLOAT\)"):
        parse(raw)


def test_packed_layer_with_disagreeing_shards_is_an_error():
    d = parse({"m.l.gate_proj.weight": "W8A8_DYNAMIC", "m.l.up_proj.weight": "FLOAT"})
    with pytest.raises(QuantDescriptionError, match="different types"):
        d.layer_type("m.l.gate_up_proj", ("gate_proj", "up_proj"))


@pytest.fixture
def single_rank(monkeypatch):
    from vllm.model_executor import parameter

    monkeypatch.setattr(parameter, "get_tensor_model_parallel_rank", lambda: 0)
    monkeypatch.setattr(parameter, "get_tensor_model_parallel_world_size", lambda: 1)


def test_int8_weights_are_deterministic_under_dummy_loading():
    a = deterministic_int8((8, 16), "model.layers.0.self_attn.q_a_proj")
    b = deterministic_int8((8, 16), "model.layers.0.self_attn.q_a_proj")
    c = deterministic_int8((8, 16), "model.layers.1.self_attn.q_a_proj")
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.dtype == torch.int8 and a.float().std() > 50          # spread over the int8 range


def test_w8a8_linear_equals_dequantized_math_within_activation_rounding(single_rank):
    torch.manual_seed(0)
    layer = torch.nn.Module()
    m = W8A8DynamicLinearMethod("x.proj")
    m.create_weights(layer, 16, [6, 4], 16, 10, torch.float32, weight_loader=None)
    w = torch.randn(10, 16)
    scale = w.abs().amax(1, keepdim=True) / 127
    layer.weight.data.copy_(torch.round(w / scale).to(torch.int8))
    layer.weight_scale.data.copy_(scale)
    m.process_weights_after_loading(layer)
    assert layer.weight.shape == (16, 10) and layer.weight.dtype == torch.int8
    x = torch.randn(3, 16)
    y = m.apply(layer, x)
    xs = x.abs().amax(1, keepdim=True) / 127
    want = (torch.round(x / xs) * xs) @ (layer.weight.float() * layer.weight_scale).double().float()
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y, x @ w.T, rtol=0.05, atol=0.05)   # close to the float layer


def test_nonzero_offsets_are_refused(single_rank):
    layer = torch.nn.Module()
    m = W8A8DynamicLinearMethod("x.proj")
    m.create_weights(layer, 4, [2], 4, 2, torch.float32, weight_loader=None)
    layer.weight_offset.data.fill_(1.0)
    with pytest.raises(ValueError, match="x.proj.*weight_offset must be zero"):
        m.process_weights_after_loading(layer)


def test_registration_uses_the_plugins_own_name_and_never_replaces_another():
    from vllm.model_executor.layers import quantization as q

    from vllm_ascend_ext.quantization import config as qc

    qc.register()
    qc.register()                                                   # idempotent
    assert q.get_quantization_config("ascend_ext") is qc.AscendExtQuantConfig
    if "ascend" in q.QUANTIZATION_METHODS:                          # vllm-ascend's, if present
        assert q.get_quantization_config("ascend") is not qc.AscendExtQuantConfig
    saved = q.QUANTIZATION_METHODS.copy()
    try:
        from vllm.model_executor.layers.quantization import _CUSTOMIZED_METHOD_TO_QUANT_CONFIG

        _CUSTOMIZED_METHOD_TO_QUANT_CONFIG["ascend_ext"] = object
        with pytest.raises(RuntimeError, match="already registered"):
            qc.register()
    finally:
        _CUSTOMIZED_METHOD_TO_QUANT_CONFIG["ascend_ext"] = qc.AscendExtQuantConfig
        q.QUANTIZATION_METHODS[:] = saved


def test_description_file_selects_the_method_unless_quantization_was_given(monkeypatch):
    from vllm.model_executor.model_loader import weight_utils

    from vllm_ascend_ext.platform.config_hooks import apply_quant_description

    monkeypatch.setattr(weight_utils, "get_quant_config", lambda mc, lc: ("cfg", mc.quantization))
    vc = SimpleNamespace(model_config=SimpleNamespace(model=str(TINY_DSA_W8A8), quantization=None),
                         load_config=None, quant_config=None)
    apply_quant_description(vc)
    assert vc.model_config.quantization == "ascend_ext" and vc.quant_config == ("cfg", "ascend_ext")
    given = SimpleNamespace(model_config=SimpleNamespace(model=str(TINY_DSA_W8A8), quantization="fp8"),
                            load_config=None, quant_config=None)
    apply_quant_description(given)
    assert given.model_config.quantization == "fp8" and given.quant_config is None
    plain = SimpleNamespace(model_config=SimpleNamespace(model=str(TINY_DSA_W8A8.parent / "tiny_dsa"),
                                                         quantization=None), load_config=None,
                            quant_config=None)
    apply_quant_description(plain)
    assert plain.model_config.quantization is None
