"""The compiled layer-op kernels of the emulation (``csrc/emu_layer_ops.cpp``: RmsNorm,
the fused add + RmsNorm, rope-mode ``npu_mrope``, ``npu_swiglu``) against a float64
computation written here from the operators' documented formulas, and against the Python
references; the cases a kernel does not take run the reference; a trace keeps the token
count dynamic through their Meta kernels."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend_ext.ops import add_rms_norm as arn
from vllm_ascend_ext.ops import grouped_matmul as gm
from vllm_ascend_ext.ops import mrope, norm
from vllm_ascend_ext.ops.compiled import emulation_kernel

pytestmark = pytest.mark.skipif(emulation_kernel("emu_rms_norm", torch.device("cpu")) is None,
                                reason="the compiled op library is not built")

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# one rounding to the dtype after fp32 arithmetic: half an ulp of the output, and fp32's
# own error on O(1) values
TOL = {torch.float32: 2e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}


def _rms64(x, gamma, eps):
    x = x.double()
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * gamma.double()


def _close(got, want, dtype):
    err = ((got.double() - want) / want.abs().clamp_min(1.0)).abs().max().item()
    assert err <= TOL[dtype], err


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_of_strided_head_rows_equals_float64(dtype):
    torch.manual_seed(0)
    qkv = torch.randn(9, 3 * 4 * 32, dtype=dtype)
    x = qkv[:, :128].view(9, 4, 32)            # Qwen3's q_norm input: strided token rows
    gamma = torch.randn(32, dtype=dtype)
    y, rstd = norm.rms_norm_emulated(x, gamma, 1e-6)
    assert y.shape == x.shape and y.dtype == dtype and rstd.shape == (9, 4, 1)
    _close(y, _rms64(x, gamma, 1e-6), dtype)
    want_rstd = 1 / torch.sqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(rstd.double(), want_rstd, rtol=1e-6, atol=0)
    ref, ref_rstd = norm.rms_norm_reference(x, gamma, 1e-6)
    torch.testing.assert_close(y, ref, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemma_norm_scales_by_one_plus_gamma(dtype):
    torch.manual_seed(1)
    x, gamma = torch.randn(5, 64, dtype=dtype), torch.randn(64, dtype=dtype)
    y, _ = norm.gemma_rms_norm_emulated(x, gamma, 1e-6)
    _close(y, _rms64(x, 1.0 + gamma.double(), 1e-6), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_returns_the_rounded_sum_and_normalises_the_fp32_sum(dtype):
    torch.manual_seed(2)
    x1, x2 = torch.randn(7, 96, dtype=dtype), torch.randn(7, 96, dtype=dtype)
    gamma = torch.randn(96, dtype=dtype)
    y, rstd, total = arn.add_rms_norm_emulated(x1, x2, gamma, 1e-5)
    s32 = x1.float() + x2.float()              # the documented fp32 add
    assert torch.equal(total, s32.to(dtype))
    _close(y, _rms64(s32, gamma, 1e-5), dtype)
    assert rstd.shape == (7, 1)


def _rope64(x, positions, cache, head_size, neox):
    """Each head's first rotary_dim elements rotated by the angle of its position."""
    tokens = x.shape[0]
    heads = x.double().view(tokens, -1, head_size).clone()
    half = cache.shape[1] // 2
    for t in range(tokens):
        cos, sin = cache[positions[t], :half].double(), cache[positions[t], half:].double()
        for i in range(half):
            a, b = (i, i + half) if neox else (2 * i, 2 * i + 1)
            x1, x2 = heads[t, :, a].clone(), heads[t, :, b].clone()
            heads[t, :, a] = x1 * cos[i] - x2 * sin[i]
            heads[t, :, b] = x2 * cos[i] + x1 * sin[i]
    return heads.view(tokens, -1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["half", "interleave"])
def test_rope_of_strided_qk_views_with_partial_rotary_equals_float64(dtype, mode):
    torch.manual_seed(3)
    head, rotary = 32, 16
    qkv = torch.randn(6, (4 + 2 + 2) * head, dtype=dtype)
    q, k = qkv[:, :4 * head], qkv[:, 4 * head:6 * head]      # views of the QKV split
    cache = torch.randn(50, rotary, dtype=dtype)
    positions = torch.tensor([0, 7, 49, 3, 3, 20])
    oq, ok = mrope.mrope_emulated(positions, q, k, cache, head, rotary_mode=mode)
    _close(oq, _rope64(q, positions, cache, head, mode == "half"), dtype)
    _close(ok, _rope64(k, positions, cache, head, mode == "half"), dtype)
    rq, rk = mrope.mrope_reference(positions, q, k, cache, head, rotary_mode=mode)
    assert torch.equal(oq, rq) and torch.equal(ok, rk)   # the same fp32 arithmetic


def test_rope_refuses_a_position_outside_the_cache():
    q, k, cache = torch.randn(2, 32), torch.randn(2, 32), torch.randn(8, 16)
    with pytest.raises(RuntimeError, match="positions must lie in"):
        mrope.mrope_emulated(torch.tensor([1, 8]), q, k, cache, 32)


@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
def test_swiglu_equals_float64(dtype):
    torch.manual_seed(4)
    x = torch.randn(3, 5, 2 * 48, dtype=dtype) * 4
    a, b = x.double().chunk(2, dim=-1)
    want = a / (1 + torch.exp(-a)) * b
    got = gm.swiglu_emulated(x)
    if dtype == torch.float64:
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    else:
        _close(got, want, dtype)


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
def test_each_kernel_rounds_once_to_nearest(dtype):
    """The fp32 result rounded once, to nearest: the kernel on the low-precision input
    equals the same kernel on its exact fp32 copy, rounded (a truncating kernel fails)."""
    torch.manual_seed(6)
    x, gamma = torch.randn(16, 64, dtype=dtype), torch.randn(64, dtype=dtype)
    assert torch.equal(norm.rms_norm_emulated(x, gamma, 1e-6)[0],
                       norm.rms_norm_emulated(x.float(), gamma, 1e-6)[0].to(dtype))
    r = torch.randn(16, 64, dtype=dtype)
    y, _, total = arn.add_rms_norm_emulated(x, r, gamma, 1e-6)
    y32, _, total32 = arn.add_rms_norm_emulated(x.float(), r.float(), gamma, 1e-6)
    assert torch.equal(y, y32.to(dtype)) and torch.equal(total, total32.to(dtype))
    s = torch.randn(16, 128, dtype=dtype) * 3
    assert torch.equal(gm.swiglu_emulated(s), gm.swiglu_emulated(s.float()).to(dtype))


def test_a_two_dim_gamma_and_int32_positions_and_an_empty_batch():
    torch.manual_seed(7)
    x, gamma = torch.randn(3, 4, 8), torch.randn(4, 8)
    y, rstd = norm.rms_norm_emulated(x, gamma, 1e-6)
    want = x.double() / torch.sqrt(x.double().pow(2).mean((-2, -1), keepdim=True) + 1e-6) \
        * gamma.double()
    _close(y, want, torch.float32)
    assert rstd.shape == (3, 1, 1)
    q, k, cache = torch.randn(3, 64), torch.randn(3, 32), torch.randn(10, 16)
    pos = torch.tensor([9, 0, 4], dtype=torch.int32)
    got = mrope.mrope_emulated(pos, q, k, cache, 32)
    _close(got[0], _rope64(q, pos.long(), cache, 32, True), torch.float32)
    empty = norm.rms_norm_emulated(torch.randn(0, 8), torch.randn(8), 1e-6)[0]
    assert empty.shape == (0, 8)
    assert gm.swiglu_emulated(torch.randn(0, 6)).shape == (0, 3)


def test_cases_the_kernels_do_not_take_run_the_reference(monkeypatch):
    """The negative control of the kernel path: a kernel that answers wrong changes the
    results of the cases it takes, not of the ones it leaves to the reference."""
    torch.manual_seed(5)
    x = torch.randn(4, 2 * 16)
    t = x.t().contiguous().t()                  # last dim strided: the reference
    wrong = lambda *a, **k: torch.zeros(4, 16)  # noqa: E731
    monkeypatch.setattr(gm, "emulation_kernel", lambda name, device: wrong)
    assert torch.equal(gm.swiglu_emulated(t), gm.swiglu_reference(t))
    assert not torch.equal(gm.swiglu_emulated(x), gm.swiglu_reference(x))
    # rope: float64, and a cache in another dtype than the query, take the reference
    q, k, cache = torch.randn(2, 32, dtype=torch.float64), torch.randn(2, 32, dtype=torch.float64), \
        torch.randn(8, 16, dtype=torch.float64)
    monkeypatch.setattr(mrope, "emulation_kernel", lambda name, device: wrong)
    pos = torch.tensor([1, 2])
    got = mrope.mrope_emulated(pos, q, k, cache, 32)
    assert torch.equal(got[0], mrope.mrope_reference(pos, q, k, cache, 32)[0])


def test_a_compiled_trace_takes_the_kernels_and_keeps_the_token_count_dynamic():
    """Dynamo traces through the kernels' Meta implementations in symbolic sizes: one
    compiled graph serves two token counts (a specialised size would recompile)."""
    import torch._dynamo

    torch._dynamo.reset()
    gamma = torch.randn(32)
    cache = torch.randn(64, 32)
    frames = []

    def backend(gm_, example_inputs):
        frames.append([n.target for n in gm_.graph.nodes if n.op == "call_function"])
        return gm_.forward

    @torch.compile(backend=backend, dynamic=True, fullgraph=True)
    def layer(x, pos):
        h = norm.npu_rms_norm(x, gamma)[0]
        q, k = mrope.npu_mrope(pos, h, h, cache, 32)
        return gm.npu_swiglu(torch.cat([q, k], -1))

    for tokens in (3, 5):
        x = torch.randn(tokens, 32)
        pos = torch.arange(tokens)
        h = norm.rms_norm_reference(x, gamma)[0]
        q, k = mrope.mrope_reference(pos, h, h, cache, 32)
        torch.testing.assert_close(layer(x, pos), gm.swiglu_reference(torch.cat([q, k], -1)))
    assert len(frames) == 1
    names = {str(t) for t in frames[0]}
    assert {"_C_ascend_ext.emu_rms_norm", "_C_ascend_ext.emu_rope",
            "_C_ascend_ext.emu_swiglu"} <= names, names
