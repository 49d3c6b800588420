"""The post-attention norm fused with a W8A8 MLP's quantization (npu_add_rms_norm_dynamic_quant,
layers/norm_quant.py), against math written here."""

from __future__ import annotations

import types

import pytest
import torch

from vllm_ascend_ext.layers import norm_quant
from vllm_ascend_ext.layers.routes import FUSED, NATIVE, norm_quant_route
from vllm_ascend_ext.ops.add_rms_norm_quant import (
    add_rms_norm_dynamic_quant_meta,
    npu_add_rms_norm_dynamic_quant,
)
from vllm_ascend_ext.ops.counting import OpCounter
from vllm_ascend_ext.quantization import w8a8_dynamic


def _expected(x1, x2, gamma, eps, smooth=None, beta=None):
    """float64, element by element where it matters: sum, norm, per-row int8 quant."""
    x = x1.double() + x2.double()
    y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * gamma.double()
    if beta is not None:
        y = y + beta.double()
    if smooth is not None:
        y = y * smooth.double()
    rows = y.reshape(-1, y.shape[-1])
    q = torch.empty_like(rows, dtype=torch.int8)
    scales = torch.empty(rows.shape[0], dtype=torch.float64)
    for r in range(rows.shape[0]):
        scale = max(abs(v) for v in rows[r].tolist()) / 127.0
        scales[r] = scale
        for c in range(rows.shape[1]):
            q[r, c] = int(torch.round(rows[r, c] / scale).clamp(-128, 127))
    return q.reshape(y.shape), scales.reshape(y.shape[:-1]), x


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(5, 32), (2, 3, 16)])
def test_reference_adds_normalises_and_quantizes_per_row(dtype, shape):
    g = torch.Generator().manual_seed(0)
    x1 = torch.randn(shape, generator=g).to(dtype)
    x2 = torch.randn(shape, generator=g).to(dtype)
    gamma = (1 + 0.1 * torch.randn(shape[-1], generator=g)).to(dtype)
    y1, y2, x_out, s1, s2 = npu_add_rms_norm_dynamic_quant(x1, x2, gamma, epsilon=1e-6)
    q, scales, x = _expected(x1, x2, gamma, 1e-6)
    assert y1.dtype == torch.int8 and s1.dtype == torch.float32
    # fp32 kernel math vs float64: a value on a rounding boundary may move one step
    assert (y1.int() - q.int()).abs().max() <= 1 and (y1 != q).float().mean() < 0.02
    torch.testing.assert_close(s1.double(), scales, rtol=1e-5, atol=0)
    assert torch.equal(x_out, x.to(dtype))
    assert y2.numel() == 0 and s2.numel() == 0          # no second path asked
    meta = add_rms_norm_dynamic_quant_meta(x1.to("meta"), x2.to("meta"), gamma.to("meta"))
    assert [(t.shape, t.dtype) for t in meta] == [(t.shape, t.dtype) for t in
                                                  (y1, y2, x_out, s1, s2)]


def test_smooth_scales_give_two_paths_and_beta_shifts():
    g = torch.Generator().manual_seed(1)
    x1, x2 = (torch.randn(4, 16, generator=g).bfloat16() for _ in range(2))
    gamma, beta = torch.ones(16).bfloat16(), (0.1 * torch.randn(16, generator=g)).bfloat16()
    s_a, s_b = (torch.rand(16, generator=g) + 0.5).bfloat16(), (torch.rand(16, generator=g) + 0.5).bfloat16()
    y1, y2, _, sc1, sc2 = npu_add_rms_norm_dynamic_quant(x1, x2, gamma, smooth_scale1=s_a,
                                                         smooth_scale2=s_b, beta=beta)
    for y, sc, smooth in ((y1, sc1, s_a), (y2, sc2, s_b)):
        q, scales, _ = _expected(x1, x2, gamma, 1e-6, smooth=smooth, beta=beta)
        assert (y.int() - q.int()).abs().max() <= 1
        torch.testing.assert_close(sc.double(), scales, rtol=1e-5, atol=0)
    with pytest.raises(ValueError, match="no output"):
        npu_add_rms_norm_dynamic_quant(x1, x2, gamma, output_mask=[False, False])
    with pytest.raises(ValueError, match="gamma"):
        npu_add_rms_norm_dynamic_quant(x1, x2, torch.ones(8).bfloat16())


def test_route_takes_half_precision_only():
    assert norm_quant_route(torch.bfloat16, torch.bfloat16)[0] == FUSED
    assert norm_quant_route(torch.float16, torch.float16)[0] == FUSED
    route, why = norm_quant_route(torch.float32, torch.float32)
    assert route == NATIVE and "float16 or bfloat16" in why
    route, why = norm_quant_route(torch.bfloat16, torch.float32)
    assert route == NATIVE and "gamma" in why


class _Linear(torch.nn.Module):
    """A W8A8 dynamic linear as the plugin's method leaves it after loading."""

    def __init__(self, k, n, g):
        super().__init__()
        self.quant_method = w8a8_dynamic.W8A8DynamicLinearMethod("test")
        self.weight = torch.randint(-127, 128, (k, n), generator=g, dtype=torch.int8)
        self.weight_scale = torch.rand(n, generator=g) * 0.01 + 0.001
        self.bias = None

    def forward(self, x):
        return self.quant_method.apply(self, x), None


class _Mlp(torch.nn.Module):
    def __init__(self, hidden, inter, g):
        super().__init__()
        self.gate_up_proj = _Linear(hidden, 2 * inter, g)
        self.down = torch.randn(inter, hidden, generator=g) * 0.05
        self.act_fn = lambda t: torch.nn.functional.silu(t[..., :inter]) * t[..., inter:]
        self.down_proj = lambda t: (t @ self.down.to(t.dtype), None)

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_up_proj(x)[0]))[0]

    def forward_prequantized(self, xq, sx, out_dtype):   # DsaMLP's unfused-activation branch
        gate_up = w8a8_dynamic.apply_prequantized(self.gate_up_proj, xq, sx, out_dtype)
        return self.down_proj(self.act_fn(gate_up))[0]


def test_fused_mlp_input_equals_norm_then_quantized_linear():
    """mlp(norm(h + residual)) through the fused op equals the unfused chain (npu_add_rms_norm,
    npu_dynamic_quant, npu_quant_matmul) up to int8 rounding steps; a negative control that
    feeds the scales of the wrong rows does not."""
    g = torch.Generator().manual_seed(2)
    hidden, inter, t = 64, 32, 6
    mlp = _Mlp(hidden, inter, g)
    norm = types.SimpleNamespace(weight=(1 + 0.1 * torch.randn(hidden, generator=g)).bfloat16(),
                                 variance_epsilon=1e-6)
    h, residual = (torch.randn(t, hidden, generator=g).bfloat16() for _ in range(2))
    assert norm_quant.takes_fused_norm_quant(mlp, "fused")
    assert not norm_quant.takes_fused_norm_quant(mlp, "native")
    with OpCounter() as c:
        out, new_residual = norm_quant.mlp_after_norm(norm, mlp, h, residual)
    ops = {k: v for k, v in c.total().items() if k.startswith("npu_")}
    assert ops == {"npu_add_rms_norm_dynamic_quant": 1, "npu_quant_matmul": 1}
    # independent: float64 norm, then the linear on it (its own quantization), then the MLP
    x = h.double() + residual.double()
    normed = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * norm.weight.double()
    expected = mlp(normed.float().bfloat16()).double()
    assert torch.equal(new_residual, x.bfloat16())
    err = (out.double() - expected).abs().max() / expected.abs().max()
    assert err < 0.03, err
    # negative control: the right int8 rows with the scales of other rows
    xq, _, _, sx, _ = npu_add_rms_norm_dynamic_quant(h, residual, norm.weight, epsilon=1e-6)
    wrong = w8a8_dynamic.apply_prequantized(mlp.gate_up_proj, xq, sx.flip(0), torch.bfloat16)
    bad = mlp.down_proj(mlp.act_fn(wrong))[0].double()
    assert (bad - expected).abs().max() / expected.abs().max() > 10 * err
    # fp32 is not the fused op's: the route declines and the caller runs the modules
    assert norm_quant.mlp_after_norm(norm, mlp, h.float(), residual.float()) is None
