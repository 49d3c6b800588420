"""Quantized weights in the NPU's format: FRACTAL_NZ on A2/A3 after loading (W8A8 linear,
W8A8 experts), ND on Ascend 950; the SFA prolog shares an NZ weight instead of keeping an
ND copy beside it; contract mode refuses an NZ ``x2`` where the docs do not give it."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from vllm.platforms import current_platform

from vllm_ascend_ext.attention.sfa.projections import SfaProjections
from vllm_ascend_ext.attention.sfa.weights import prepare
from vllm_ascend_ext.contract.harness import ContractViolation
from vllm_ascend_ext.moe.expert_shard import ExpertShard
from vllm_ascend_ext.moe.routing import SOFTMAX, RoutingPlan
from vllm_ascend_ext.moe.w8a8 import AscendW8A8FusedMoEMethod
from vllm_ascend_ext.ops.format import (
    ACL_FORMAT_FRACTAL_NZ,
    ACL_FORMAT_ND,
    as_format,
    npu_format,
    npu_format_cast,
)
from vllm_ascend_ext.ops.quant import npu_dynamic_quant, npu_quant_matmul
from vllm_ascend_ext.platform.soc import from_name
from vllm_ascend_ext.quantization.w8a8_dynamic import W8A8DynamicLinearMethod
from vllm_ascend_ext.quantization.weight_format import quantized_weight_format

NZ, ND = ACL_FORMAT_FRACTAL_NZ, ACL_FORMAT_ND
FAMILIES = {"ascend910b2": NZ, "ascend910_9391": NZ, "ascend950": ND}


@pytest.fixture
def soc(monkeypatch):
    """The serving platform's SoC, as the weight hooks read it."""
    from vllm.model_executor import parameter

    monkeypatch.setattr(parameter, "get_tensor_model_parallel_rank", lambda: 0)
    monkeypatch.setattr(parameter, "get_tensor_model_parallel_world_size", lambda: 1)

    def use(name: str) -> None:
        monkeypatch.setattr(current_platform, "soc", lambda: from_name(name), raising=False)
    return use


def test_int8_matmul_weights_are_nz_on_a2_and_a3_only_unless_turned_off():
    assert [quantized_weight_format(f) for f in ("A2", "A3", "A5", "310P")] == [NZ, NZ, ND, ND]
    assert {quantized_weight_format(f, "off") for f in ("A2", "A3", "A5")} == {ND}
    with pytest.raises(ValueError, match="weight_nz='on'"):
        quantized_weight_format("A2", "on")


def test_a_cast_is_a_new_tensor_with_the_same_values_and_a_second_cast_is_none():
    w = torch.randint(-127, 128, (16, 8), dtype=torch.int8)
    nz = npu_format_cast(w, NZ)
    assert npu_format(nz) == NZ and npu_format(w) == ND
    assert nz.data_ptr() != w.data_ptr() and torch.equal(nz, w)     # allocates, as on an NPU
    assert as_format(nz, NZ) is nz and npu_format_cast(nz, NZ) is nz


def _w8a8_linear(prefix: str, n_in: int, n_out: int, seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    layer = nn.Module()
    layer.quant_method = W8A8DynamicLinearMethod(prefix)
    layer.quant_method.create_weights(layer, n_in, [n_out], n_in, n_out, torch.float32,
                                      weight_loader=None)
    layer.weight.data.copy_(torch.randint(-127, 128, (n_out, n_in), generator=g))
    layer.weight_scale.data.copy_(torch.rand(n_out, 1, generator=g) / 100 + 1e-3)
    layer.loaded = (layer.weight.data.clone(), layer.weight_scale.data.clone())
    layer.quant_method.process_weights_after_loading(layer)
    return layer


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_w8a8_linear_takes_the_family_format_and_computes_the_same(soc, name):
    soc(name)
    layer = _w8a8_linear("m.proj", 16, 12, 0)
    w, s = layer.loaded
    assert npu_format(layer.weight) == FAMILIES[name] and layer.weight.shape == (16, 12)
    assert isinstance(layer.weight, nn.Parameter) and torch.equal(layer.weight, w.t())
    x = torch.randn(3, 16)
    xs = x.abs().amax(1, keepdim=True) / 127
    want = (torch.round(x / xs) * xs).double() @ (w.double() * s.double()).t()
    torch.testing.assert_close(layer.quant_method.apply(layer, x).double(), want,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_w8a8_experts_take_the_family_format_after_the_transpose(soc, name):
    soc(name)
    g = torch.Generator().manual_seed(1)
    e, k, n = 3, 8, 6
    layer = nn.Module()
    loaded = {}
    for stem, shape in (("w13", (e, 2 * n, k)), ("w2", (e, k, n))):
        loaded[stem] = torch.randint(-127, 128, shape, generator=g, dtype=torch.int8)
        layer.register_parameter(f"{stem}_weight", nn.Parameter(loaded[stem].clone(),
                                                                requires_grad=False))
        layer.get_parameter(f"{stem}_weight").weight_loader = "kept"
        for suffix in ("weight_scale", "weight_offset"):
            layer.register_parameter(f"{stem}_{suffix}", nn.Parameter(
                torch.zeros(*shape[:2], 1), requires_grad=False))
    method = object.__new__(AscendW8A8FusedMoEMethod)      # only the weight hook is exercised
    method.prefix, method.dummy = "m.experts", False
    method.plan, method.shard = RoutingPlan(SOFTMAX, 2, e), ExpertShard(e, e)
    method.weight_format = quantized_weight_format(from_name(name).family)
    method.process_weights_after_loading(layer)
    for stem in ("w13", "w2"):
        w = getattr(layer, f"{stem}_weight")
        assert npu_format(w) == FAMILIES[name] and w.weight_loader == "kept"
        assert torch.equal(w, loaded[stem].transpose(1, 2))


class _Float(nn.Module):
    def __init__(self, n_in, n_out, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.weight = nn.Parameter(torch.randn(n_out, n_in, generator=g) / n_in ** 0.5,
                                   requires_grad=False)


def _sfa_projections(heads=2, nope=8, v=8, hidden=32, q_lora=16, kv_lora=16, rope=8):
    o = nn.Module()
    o.q_a_proj = _w8a8_linear("a.q_a_proj", hidden, q_lora, 1)
    o.q_b_proj = _w8a8_linear("a.q_b_proj", q_lora, heads * (nope + rope), 2)
    o.kv_a_proj_with_mqa = _w8a8_linear("a.kv_a_proj_with_mqa", hidden, kv_lora + rope, 3)
    o.kv_b_proj = _Float(kv_lora, heads * (nope + v), 4)
    o.q_a_layernorm = o.kv_a_layernorm = o.indexer = None
    return SfaProjections.of(o)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_sfa_prolog_keeps_one_copy_of_each_w8a8_weight(soc, name):
    soc(name)
    proj = _sfa_projections()
    linears = [proj.q_a_proj, proj.q_b_proj, proj.kv_a_proj_with_mqa]
    originals = [(lin.weight, lin.weight.clone()) for lin in linears]
    nd_bytes = sum(lin.weight.numel() for lin in linears)               # int8
    w = prepare(proj, heads=2, nope_dim=8, v_dim=8, route="prolog_v3", dispose_fallback=True)
    prolog = (w.prolog.w_dq, w.prolog.w_uq_qr, w.prolog.w_dkv_kr)
    assert all(npu_format(t) == NZ for t in prolog)
    for t, (_, values) in zip(prolog, originals):
        assert torch.equal(t, values)
    if FAMILIES[name] == NZ:   # the linear's weight is the prolog's: shared and kept
        assert all(t is param for t, (param, _) in zip(prolog, originals))
        assert all(lin.weight is t for lin, t in zip(linears, prolog))
        assert w.fallback_bytes_freed == 0
    else:                      # 950: the prolog's NZ copy; the ND original released
        assert all(t.data_ptr() != param.data_ptr() for t, (param, _) in zip(prolog, originals))
        assert w.fallback_bytes_freed == nd_bytes
        assert all(lin.weight.numel() == 0 for lin in linears)
    resident = {t.data_ptr() for t in prolog} | {lin.weight.data_ptr() for lin in linears
                                                 if lin.weight.numel()}
    assert len(resident) == 3                       # never an ND copy beside an NZ one


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_contract_gives_an_nz_x2_to_a2_and_a3_only(contract, name):
    contract(name)
    xq, sx = npu_dynamic_quant(torch.randn(4, 32, dtype=torch.bfloat16))
    w = npu_format_cast(torch.randint(-127, 128, (32, 16), dtype=torch.int8), NZ)
    scale = torch.rand(16) / 100

    def call(weight):
        return npu_quant_matmul(xq, weight, scale, pertoken_scale=sx, output_dtype=torch.bfloat16)
    assert call(torch.randint(-127, 128, (32, 16), dtype=torch.int8)).shape == (4, 16)  # ND: any
    if FAMILIES[name] == NZ:
        assert call(w).shape == (4, 16)
    else:
        with pytest.raises(ContractViolation, match=r"npu_quant_matmul: argument x2: x2 is "
                                                    r"FRACTAL_NZ on A5.*仅支持如下产品"):
            call(w)


def test_weight_nz_off_keeps_int8_weights_nd_on_a2(soc):
    from vllm.config import VllmConfig, set_current_vllm_config

    soc("ascend910b2")
    off = VllmConfig(additional_config={"ascend_ext": {"weight_nz": "off"}})
    with set_current_vllm_config(off):
        layer = _w8a8_linear("m.proj", 16, 12, 0)
    assert npu_format(layer.weight) == ND
    with set_current_vllm_config(VllmConfig()):
        assert npu_format(_w8a8_linear("m.proj", 16, 12, 0).weight) == NZ
