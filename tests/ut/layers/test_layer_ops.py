"""The plugin's layer ops (``layers/``) and the fused operators under them
(``npu_add_rms_norm``, ``npu_gemma_rms_norm``, ``npu_mrope`` in rope mode, ``npu_swiglu``).

Every expected value is computed here, independently: float64 math or explicit per-token /
per-head / per-pair loops, and vLLM's own ``forward_native`` / ``forward_static``.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

from vllm_ascend_ext.config import AscendExtConfigError, parse_config
from vllm_ascend_ext.contract import docs, metas
from vllm_ascend_ext.contract.layer_op_rules import LAYER_OP_RULES
from vllm_ascend_ext.contract.rules import Call
from vllm_ascend_ext.errors import AscendExtError
from vllm_ascend_ext.layers import REPLACED, register, routes
from vllm_ascend_ext.layers.activation import AscendSiluAndMul
from vllm_ascend_ext.layers.norm import AscendGemmaRMSNorm, AscendRMSNorm
from vllm_ascend_ext.layers.rope import AscendRotaryEmbedding
from vllm_ascend_ext.ops.add_rms_norm import add_rms_norm_meta, npu_add_rms_norm
from vllm_ascend_ext.ops.counting import OpCounter
from vllm_ascend_ext.ops.mrope import npu_mrope
from vllm_ascend_ext.ops.norm import npu_gemma_rms_norm
from vllm_ascend_ext.platform.config_hooks import layer_ops_switch

F32, BF16 = torch.float32, torch.bfloat16
TOL = {F32: dict(rtol=1e-5, atol=1e-5), BF16: dict(rtol=2e-2, atol=2e-2)}
# One bf16 rounding of an exact value: half an ulp (2^-8 relative), plus fp32 noise.
ROUND = {F32: dict(rtol=1e-5, atol=1e-6), BF16: dict(rtol=2 ** -8 + 1e-4, atol=1e-6)}


@pytest.fixture(scope="module")
def vcfg():
    return VllmConfig()


def _npu_counts(counter: OpCounter) -> dict[str, int]:
    return {k: v for k, v in counter.total().items() if k.startswith("npu_")}


# 1. npu_add_rms_norm -------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("shape,gdims", [((5, 64), 1), ((2, 3, 32), 1), ((2, 3, 32), 2)])
def test_add_rms_norm_matches_float64(dtype, shape, gdims):
    g = torch.Generator().manual_seed(1)
    x1, x2 = (torch.randn(shape, generator=g).to(dtype) for _ in range(2))
    gamma = (1 + 0.1 * torch.randn(shape[-gdims:], generator=g)).to(dtype)
    eps = 1e-6
    y, rstd, x_out = npu_add_rms_norm(x1, x2, gamma, eps)
    s = x1.double() + x2.double()
    dims = tuple(range(len(shape) - gdims, len(shape)))
    r = 1.0 / torch.sqrt((s * s).mean(dim=dims, keepdim=True) + eps)
    torch.testing.assert_close(y.double(), (s * r * gamma.double()), **ROUND[dtype])
    assert torch.equal(x_out, s.to(dtype)) and x_out.dtype == dtype
    torch.testing.assert_close(rstd.double(), r, rtol=1e-5, atol=0)
    # The plugin's meta and the official one (torch-npu's Python Meta kernel) agree.
    official = metas.op("npu_add_rms_norm")
    for meta in (add_rms_norm_meta(x1, x2, gamma, eps),
                 official(*(t.to("meta") for t in (x1, x2, gamma)), eps)):
        assert [(tuple(m.shape), m.dtype) for m in meta] == [
            (tuple(o.shape), o.dtype) for o in (y, rstd, x_out)]
    assert rstd.dtype == F32 and tuple(rstd.shape) == tuple(
        1 if i in dims else n for i, n in enumerate(shape))


def test_add_rms_norm_negative_control_and_bad_shapes():
    x1, x2, gamma = torch.randn(4, 16), torch.randn(4, 16), torch.ones(16)
    y = npu_add_rms_norm(x1, x2, gamma)[0]
    wrong = x1.double() / torch.sqrt(x1.double().pow(2).mean(-1, keepdim=True) + 1e-6)
    assert not torch.allclose(y.double(), wrong, atol=1e-2)  # the residual add matters
    for a, b, gm in [(x1, x2[:, :8], gamma), (x1, x2.bfloat16(), gamma), (x1, x2, torch.ones(8)),
                     (x1, x2, torch.ones(2, 16)), (x1, x2, torch.tensor(1.0))]:
        with pytest.raises(ValueError, match="npu_add_rms_norm"):
            npu_add_rms_norm(a, b, gm)


# 2. npu_gemma_rms_norm -----------------------------------------------------------------

@pytest.mark.parametrize("dtype", [F32, BF16])
def test_gemma_rms_norm_matches_float64_and_control(dtype):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 48, generator=g).to(dtype)
    w = (0.1 * torch.randn(48, generator=g)).to(dtype)
    y, rstd = npu_gemma_rms_norm(x, w, 1e-6)
    xd = x.double()
    r = 1.0 / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(y.double(), xd * r * (1 + w.double()), **ROUND[dtype])
    torch.testing.assert_close(rstd.double(), r, rtol=1e-5, atol=0)
    # Negative control: the plain scale w (not 1 + w) is far from the op's output.
    assert not torch.allclose(y.double(), xd * r * w.double(), atol=0.1)


# 3. npu_mrope (rope mode) --------------------------------------------------------------

def _cache(rows: int, rotary_dim: int, base: float = 10000.0) -> torch.Tensor:
    inv = 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    f = torch.outer(torch.arange(rows, dtype=torch.float64), inv)
    return torch.cat((f.cos(), f.sin()), dim=-1)  # [rows, rotary_dim], cat(cos, sin)


def _loop_rope(pos, x, cache, head_size, neox):
    """Explicit per-token / per-head / per-pair RoPE in float64 (python floats)."""
    out = x.double().clone()
    half = cache.shape[1] // 2
    for t in range(x.shape[0]):
        p = int(pos[t])
        for h in range(x.shape[1] // head_size):
            b = h * head_size
            for i in range(half):
                c, s = float(cache[p, i]), float(cache[p, half + i])
                a, d = (b + i, b + half + i) if neox else (b + 2 * i, b + 2 * i + 1)
                x0, x1 = float(x[t, a]), float(x[t, d])
                out[t, a], out[t, d] = x0 * c - x1 * s, x1 * c + x0 * s
    return out


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("head_size,rotary_dim", [(32, 32), (32, 16), (64, 16)])
@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64])
def test_mrope_matches_explicit_loop(neox, head_size, rotary_dim, pos_dtype):
    g = torch.Generator().manual_seed(3)
    nq, nk, tokens = 3, 1, 4
    pos = torch.tensor([0, 7, 3, 15], dtype=pos_dtype)
    q = torch.randn(tokens, nq * head_size, generator=g)
    k = torch.randn(tokens, nk * head_size, generator=g)
    cache = _cache(16, rotary_dim)
    mode = "half" if neox else "interleave"
    qo, ko = npu_mrope(pos, q, k, cache.float(), head_size, mrope_section=[0, 0, 0],
                       rotary_mode=mode)
    for x, o in ((q, qo), (k, ko)):
        want = _loop_rope(pos, x, cache, head_size, neox)
        torch.testing.assert_close(o.double(), want, rtol=1e-5, atol=1e-5)
        tail = o.view(tokens, -1, head_size)[..., rotary_dim:]
        assert torch.equal(tail, x.view(tokens, -1, head_size)[..., rotary_dim:])
    # Negative control: the other style's reference differs from the op's output.
    assert not torch.allclose(qo.double(), _loop_rope(pos, q, cache, head_size, not neox),
                              atol=1e-2)


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("rotary_dim", [64, 32])
def test_mrope_strided_views_and_vllm_forward_static(neox, rotary_dim):
    g = torch.Generator().manual_seed(4)
    hs, nq, nk, tokens = 64, 4, 2, 5
    qkv = torch.randn(tokens, (nq + 2 * nk) * hs, generator=g)
    q, k = qkv[:, :nq * hs], qkv[:, nq * hs:(nq + nk) * hs]
    assert not q.is_contiguous() and not k.is_contiguous()
    pos = torch.randint(0, 32, (tokens,), generator=g)
    cache = _cache(32, rotary_dim).float()
    mode = "half" if neox else "interleave"
    qo, ko = npu_mrope(pos, q, k, cache, hs, rotary_mode=mode)
    qc, kc = npu_mrope(pos, q.contiguous(), k.contiguous(), cache, hs, rotary_mode=mode)
    assert torch.equal(qo, qc) and torch.equal(ko, kc)
    official = metas.op("npu_mrope")(*(t.to("meta") for t in (pos, q, k, cache)), hs,
                                     mrope_section=[0, 0, 0], rotary_mode=mode)
    assert [(o.shape, o.dtype) for o in official] == [(o.shape, o.dtype) for o in (qo, ko)]
    vq, vk = RotaryEmbedding.forward_static(pos, q.clone(), k.clone(), hs, rotary_dim, cache,
                                            neox)
    torch.testing.assert_close(qo, vq, **TOL[F32])
    torch.testing.assert_close(ko, vk, **TOL[F32])


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2 ** 31 - 1), st.sampled_from([(16, 16), (32, 16), (48, 32)]),
       st.integers(1, 3), st.integers(1, 3), st.booleans())
def test_mrope_matches_vllm_for_random_shapes(seed, dims, nq, nk, neox):
    hs, rd = dims
    g = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, 8, (3,), generator=g, dtype=torch.int32)
    q, k = torch.randn(3, nq * hs, generator=g), torch.randn(3, nk * hs, generator=g)
    cache = _cache(8, rd).float()
    qo, ko = npu_mrope(pos, q, k, cache, hs, rotary_mode="half" if neox else "interleave")
    vq, vk = RotaryEmbedding.forward_static(pos.long(), q, k, hs, rd, cache, neox)
    torch.testing.assert_close(qo, vq, **TOL[F32])
    torch.testing.assert_close(ko, vk, **TOL[F32])


def test_mrope_errors():
    q, k, cache, pos = torch.randn(2, 64), torch.randn(2, 32), _cache(8, 32).float(), torch.arange(2)
    with pytest.raises(ValueError, match="npu_mrope.*1-D positions"):
        npu_mrope(pos.repeat(3, 1), q, k, cache, 32)
    with pytest.raises(ValueError, match="rotary_mode 'interleaved'"):
        npu_mrope(pos, q, k, cache, 32, rotary_mode="interleaved")
    with pytest.raises(ValueError, match="rotary_dim 64 .*at most head_size 32"):
        npu_mrope(pos, q, k, _cache(8, 64).float(), 32)


# 4. The layer classes against vLLM's forward_native ------------------------------------

@pytest.mark.parametrize("dtype", [F32, BF16])
def test_rms_norm_layer(vcfg, dtype):
    with set_current_vllm_config(vcfg):
        layer = AscendRMSNorm(64, eps=1e-5, dtype=dtype)
    layer.weight.data = (1 + 0.1 * torch.randn(64)).to(dtype)
    x, res = torch.randn(7, 64).to(dtype), torch.randn(7, 64).to(dtype)
    with OpCounter() as c:
        y = layer.forward_oot(x)
    assert _npu_counts(c) == {"npu_rms_norm": 1}
    torch.testing.assert_close(y, layer.forward_native(x.clone()), **TOL[dtype])
    with OpCounter() as c:
        y2, r2 = layer.forward_oot(x, res)
    assert _npu_counts(c) == {"npu_add_rms_norm": 1}
    ny, nr = layer.forward_native(x.clone(), res.clone())
    torch.testing.assert_close(y2, ny, **TOL[dtype])
    assert torch.equal(r2, nr)


def test_rms_norm_layer_native_fallbacks(vcfg):
    with set_current_vllm_config(vcfg):
        layers = [AscendRMSNorm(64, var_hidden_size=32), AscendRMSNorm(64, has_weight=False),
                  AscendRMSNorm(64, dtype=F32)]
    x = torch.randn(3, 64)
    for layer, xin in zip(layers, (x, x, x.bfloat16()), strict=True):
        with OpCounter() as c:
            y = layer.forward_oot(xin)
        assert _npu_counts(c) == {}
        assert torch.equal(y, layer.forward_native(xin.clone()))


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_gemma_rms_norm_layer(vcfg, dtype):
    with set_current_vllm_config(vcfg):
        layer = AscendGemmaRMSNorm(64, eps=1e-6)
    layer.weight = torch.nn.Parameter((0.1 * torch.randn(64)).to(dtype))
    x, res = torch.randn(9, 64).to(dtype), torch.randn(9, 64).to(dtype)
    with OpCounter() as c:
        y = layer.forward_oot(x)
    assert _npu_counts(c) == {"npu_gemma_rms_norm": 1}
    torch.testing.assert_close(y, layer.forward_native(x.clone()), **TOL[dtype])
    strided = torch.randn(9, 128).to(dtype)[:, ::2]
    torch.testing.assert_close(layer.forward_oot(strided), layer.forward_native(strided),
                               **TOL[dtype])
    with OpCounter() as c:
        y2, r2 = layer.forward_oot(x, res)
    assert _npu_counts(c) == {"npu_add_rms_norm": 1}
    ny, nr = layer.forward_native(x.clone(), res.clone())
    torch.testing.assert_close(y2, ny, **TOL[dtype])
    assert torch.equal(r2, nr)
    # Negative control: Gemma's (1 + w) is not the plain RMSNorm's w.
    xd = x.double() + res.double()
    plain = xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * layer.weight.double()
    assert not torch.allclose(y2.double(), plain, atol=0.1)


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("dtype,rotary_dim", [(F32, 64), (F32, 32), (F32, 16), (BF16, 64),
                                              (BF16, 32)])
def test_rotary_embedding_layer(vcfg, neox, dtype, rotary_dim):
    hs, nq, nk, tokens = 64, 4, 2, 6
    with set_current_vllm_config(vcfg):
        layer = AscendRotaryEmbedding(hs, rotary_dim, 128, 10000.0, neox, dtype)
    qkv = torch.randn(tokens, (nq + 2 * nk) * hs).to(dtype)
    q, k = qkv[:, :nq * hs], qkv[:, nq * hs:(nq + nk) * hs]  # strided, as after the QKV split
    pos = torch.randint(0, 128, (tokens,))
    with OpCounter() as c:
        qo, ko = layer.forward_oot(pos, q, k)
    assert _npu_counts(c) == {"npu_mrope": 1}
    nq_, nk_ = layer.forward_native(pos, q.clone(), k.clone())
    torch.testing.assert_close(qo, nq_, **TOL[dtype])
    torch.testing.assert_close(ko, nk_, **TOL[dtype])
    assert qo.shape == q.shape and ko.shape == k.shape


def test_rotary_embedding_layer_native_fallbacks(vcfg):
    with set_current_vllm_config(vcfg):
        full = AscendRotaryEmbedding(64, 64, 64, 10000.0, True, F32)
        bf16_16 = AscendRotaryEmbedding(64, 16, 64, 10000.0, False, BF16)
    pos = torch.arange(3)
    q, k = torch.randn(3, 128), torch.randn(3, 64)
    cases = [(full, q, None), (bf16_16, q.bfloat16(), k.bfloat16())]
    for layer, qq, kk in cases:
        with OpCounter() as c:
            out = layer.forward_oot(pos, qq, kk)
        assert _npu_counts(c) == {}
        want = layer.forward_native(pos, qq.clone(), None if kk is None else kk.clone())
        assert torch.equal(out[0], want[0])
        assert (out[1] is None) if kk is None else torch.equal(out[1], want[1])


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_silu_and_mul_layer(vcfg, dtype):
    with set_current_vllm_config(vcfg):
        layer = AscendSiluAndMul()
    x = torch.randn(5, 2, 96).to(dtype)
    with OpCounter() as c:
        y = layer.forward_oot(x)
    assert _npu_counts(c) == {"npu_swiglu": 1}
    torch.testing.assert_close(y, layer.forward_native(x), **TOL[dtype])
    a, b = x[..., :48].double(), x[..., 48:].double()
    torch.testing.assert_close(y.double(), a / (1 + torch.exp(-a)) * b, **TOL[dtype])


# 5. routes -----------------------------------------------------------------------------

I8 = torch.int8
ROUTE_CASES = [
    (routes.rms_norm_route, (F32, 2, F32, True, 32), "native", "prefix of the hidden size (32)"),
    (routes.rms_norm_route, (F32, 2, F32, False, None), "native", "no weight"),
    (routes.rms_norm_route, (I8, 2, I8, True, None), "native", "input dtype torch.int8"),
    (routes.rms_norm_route, (BF16, 2, F32, True, None), "native", "weight dtype torch.float32"),
    (routes.rms_norm_route, (BF16, 1, BF16, True, None), "native", "1-D input"),
    (routes.rms_norm_route, (BF16, 9, BF16, True, None), "native", "2-8 dims"),
    (routes.rms_norm_route, (BF16, 3, BF16, True, None), "fused", "npu_rms_norm"),
    (routes.gemma_norm_route, (torch.float64, torch.float64), "native", "input dtype"),
    (routes.gemma_norm_route, (BF16, F32), "native", "npu_gemma_rms_norm asks them equal"),
    (routes.gemma_norm_route, (torch.float16, torch.float16), "fused", "npu_gemma_rms_norm"),
    (routes.rope_route, (64, 64, F32, False), "native", "no key"),
    (routes.rope_route, (64, 64, torch.float64, True), "native", "dtype torch.float64"),
    (routes.rope_route, (64, 16, BF16, True), "native", "not a multiple of 32 (bfloat16)"),
    (routes.rope_route, (64, 48, torch.float16, True), "native", "not a multiple of 32"),
    (routes.rope_route, (64, 24, F32, True), "native", "not a multiple of 16 (float32)"),
    (routes.rope_route, (64, 128, F32, True), "native", "exceeds head_size 64"),
    (routes.rope_route, (64, 16, F32, True), "fused", "npu_mrope"),
    (routes.rope_route, (128, 64, BF16, True), "fused", "npu_mrope"),
    (routes.swiglu_route, (I8, 64), "native", "dtype torch.int8"),
    (routes.swiglu_route, (BF16, 63), "native", "last dim 63 is odd"),
    (routes.swiglu_route, (BF16, 64), "fused", "npu_swiglu"),
]


@pytest.mark.parametrize("fn,args,route,why", ROUTE_CASES)
def test_routes(fn, args, route, why):
    got, reason = fn(*args)
    assert got == route and why in reason, (got, reason)


# 6. config -----------------------------------------------------------------------------

def _fake(layer_ops=None, custom_ops=()):
    extra = None if layer_ops is None else {"ascend_ext": {"layer_ops": layer_ops}}
    return SimpleNamespace(compilation_config=SimpleNamespace(custom_ops=list(custom_ops)),
                           additional_config=extra)


def test_layer_ops_config_key():
    assert parse_config(None).layer_ops == "fused"
    assert parse_config({"ascend_ext": {"layer_ops": "native"}}).layer_ops == "native"
    with pytest.raises(AscendExtConfigError, match=r"layer_ops.*'fuse'.*'fused'.*'native'"):
        parse_config({"ascend_ext": {"layer_ops": "fuse"}})


@pytest.mark.parametrize("choice,added", [(None, []), ("fused", []),
                                          ("native", ["-gemma_rms_norm", "-rotary_embedding",
                                                      "-silu_and_mul"])])
def test_layer_ops_switch(choice, added):
    """"native" writes vLLM's off entries; "fused" writes nothing: a "+rotary_embedding"
    would switch on every vLLM RoPE variant sharing the name (see the test below)."""
    cfg = _fake(choice, ["none", "-rms_norm"] if choice == "native" else ["none"])
    layer_ops_switch(cfg)
    want = (["none", "-rms_norm"] + added) if choice == "native" else ["none"]
    assert cfg.compilation_config.custom_ops == want
    layer_ops_switch(cfg)
    assert cfg.compilation_config.custom_ops == want  # idempotent


def test_plugin_ops_are_on_unless_disabled_and_leave_vllms_rope_variants_alone():
    """Under Inductor vLLM's default is "none": after the start-up switch the plugin's
    classes are on (their own ``enabled``) while vLLM's Llama 3 RoPE (a ``rotary_embedding``
    too) keeps its native forward, not the CPU platform's x86 kernel (which a
    "+rotary_embedding" entry would give it: the negative control); "-rotary_embedding"
    turns the plugin's off."""
    from vllm.config import CompilationConfig
    from vllm.model_executor.layers.rotary_embedding.llama3_rope import Llama3RotaryEmbedding

    def built(custom_ops, switch=True):
        cfg = VllmConfig(compilation_config=CompilationConfig(custom_ops=list(custom_ops)))
        if switch:
            layer_ops_switch(cfg)
        with set_current_vllm_config(cfg):
            llama3 = Llama3RotaryEmbedding(64, 64, 256, 10000.0, True, F32, 8.0, 1.0, 4.0, 8192)
            on = (AscendRotaryEmbedding.enabled(), AscendRMSNorm.enabled())
        return getattr(llama3._forward_method, "__func__", None), on

    method, on = built(["none"])
    assert on == (True, True) and method is not RotaryEmbedding.forward_cpu
    method, _ = built(["none", "+rotary_embedding"], switch=False)
    assert method is RotaryEmbedding.forward_cpu             # what the old switch did
    _, on = built(["none", "-rotary_embedding"], switch=False)
    assert on == (False, True)


@pytest.mark.parametrize("choice,clash", [("fused", "-rms_norm"), ("native", "+silu_and_mul")])
def test_layer_ops_switch_refuses_the_opposite_sign(choice, clash):
    cfg = _fake(choice, ["all", clash])
    with pytest.raises(AscendExtError, match=f"layer_ops='{choice}'.*'\\{clash}'"):
        layer_ops_switch(cfg)
    assert cfg.compilation_config.custom_ops == ["all", clash]  # untouched


# 7. register() -------------------------------------------------------------------------

@pytest.fixture
def restored_registry():
    """register() fills vLLM's process-wide registry: put it back for later tests."""
    from vllm.model_executor.custom_op import op_registry_oot

    before = dict(op_registry_oot)
    names = {cls: cls.__dict__.get("name") for cls in (AscendRMSNorm, AscendGemmaRMSNorm,
                                                         AscendRotaryEmbedding, AscendSiluAndMul)}
    yield
    op_registry_oot.clear()
    op_registry_oot.update(before)
    for cls, name in names.items():
        if name is None:
            cls.__dict__.get("name") is not None and delattr(cls, "name")
        else:
            cls.name = name


def test_register_replaces_vllm_classes_under_their_custom_op_names(vcfg, restored_registry):
    from vllm.model_executor.custom_op import op_registry_oot
    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.layernorm import GemmaRMSNorm, RMSNorm

    register()
    register()  # idempotent
    plugin = {"RMSNorm": AscendRMSNorm, "GemmaRMSNorm": AscendGemmaRMSNorm,
              "RotaryEmbedding": AscendRotaryEmbedding, "SiluAndMul": AscendSiluAndMul}
    for key, cls in plugin.items():
        assert op_registry_oot[key] is cls and cls.name == REPLACED[key]
    assert REPLACED == {"RMSNorm": "rms_norm", "GemmaRMSNorm": "gemma_rms_norm",
                        "RotaryEmbedding": "rotary_embedding", "SiluAndMul": "silu_and_mul"}
    with set_current_vllm_config(vcfg):
        assert type(RMSNorm(32)) is AscendRMSNorm
        assert type(GemmaRMSNorm(32)) is AscendGemmaRMSNorm
        assert type(SiluAndMul()) is AscendSiluAndMul
        rope = RotaryEmbedding(32, 32, 16, 10000.0, True, F32)
    assert type(rope) is AscendRotaryEmbedding


# 8. Contract rules ---------------------------------------------------------------------

def _problems(op, **values):
    call = Call(op=op, values=values, soc="ascend910b2", family="A2", mutable=())
    return [r.argument for r in LAYER_OP_RULES if r.op == op and r.check(call)]


def _rope_values(**over):
    v = dict(positions=torch.tensor([0, 3, 7]), query=torch.randn(3, 128, dtype=BF16),
             key=torch.randn(3, 64, dtype=BF16), cos_sin_cache=torch.randn(8, 32, dtype=BF16),
             head_size=64, mrope_section=[0, 0, 0], rotary_mode="half", cache_mode="default")
    v.update(over)
    return v


def test_contract_rules_flag_bad_calls_and_pass_good_ones():
    x, w = torch.randn(4, 64, dtype=BF16), torch.randn(64, dtype=BF16)
    g = "npu_gemma_rms_norm"
    assert _problems(g, self=x, gamma=w, epsilon=1e-6) == []
    assert _problems(g, self=torch.randn(64, 4, dtype=BF16).t(), gamma=w) == ["self"]
    assert _problems(g, self=x, gamma=w.float()) == ["gamma"]
    assert _problems(g, self=x.to(torch.float64), gamma=w.to(torch.float64)) == ["self"]
    m = "npu_mrope"
    assert _problems(m, **_rope_values()) == []
    assert _problems(m, **_rope_values(rotary_mode="interleave")) == []
    assert _problems(m, **_rope_values(cos_sin_cache=torch.randn(8, 16, dtype=BF16))) == [
        "cos_sin_cache"]
    assert _problems(m, **_rope_values(query=torch.randn(3, 128), key=torch.randn(3, 64),
                                       cos_sin_cache=torch.randn(8, 16))) == []  # fp32: 16 ok
    assert _problems(m, **_rope_values(positions=torch.tensor([0, 8, 1]))) == ["positions"]
    assert _problems(m, **_rope_values(positions=torch.tensor([0, -1, 1]))) == ["positions"]
    assert _problems(m, **_rope_values(positions=torch.tensor([0.0, 1.0, 2.0]))) == [
        "positions"]
    assert _problems(m, **_rope_values(rotary_mode="interleaved")) == ["rotary_mode"]
    assert _problems(m, **_rope_values(query=torch.randn(3, 2, 64, dtype=BF16))) == ["query"]


def test_every_layer_op_rule_quotes_the_documentation():
    assert {r.op for r in LAYER_OP_RULES} == {"npu_gemma_rms_norm", "npu_mrope",
                                              "npu_add_rms_norm_dynamic_quant",
                                              "npu_dequant_swiglu_quant",
                                              "npu_top_k_top_p"}
    for rule in LAYER_OP_RULES:
        assert rule.quote in docs.line(rule.op, rule.quote)
        assert rule.quote in rule.cites()
    with pytest.raises(docs.DocLineMissing):
        docs.line("npu_mrope", "rotary_mode只支持'interleaved'")


def test_the_tests_cos_sin_cache_is_vllms(vcfg):
    """Guards the references above: the test's cache equals vLLM's, cos(p * f) first."""
    with set_current_vllm_config(vcfg):
        layer = RotaryEmbedding(64, 32, 64, 10000.0, True, F32)
    ours = _cache(64, 32)
    torch.testing.assert_close(layer.cos_sin_cache.double(), ours, rtol=1e-5, atol=1e-5)
    assert math.isclose(float(ours[3, 0]), math.cos(3.0)) and float(ours[3, 16]) == math.sin(3.0)
