"""NPU parity for the layer ops' operators and the W8A8 fused experts (skipped without an
Ascend NPU): RMSNorm with and without the residual add, Gemma's RMSNorm both ways the
layer calls it, RoPE (``npu_mrope`` in rope mode on strided QKV slices, full, partial and
interleaved), the add + RmsNorm + dynamic quant of a W8A8 MLP, and the routing that
quantizes plus ``npu_grouped_matmul_swiglu_quant`` on FRACTAL_NZ experts.
Cases: ``vllm_ascend_ext/tools/npu_parity_layers.py``."""

from __future__ import annotations

import pytest

from tests.npu.test_parity import _check
from vllm_ascend_ext.platform.probe import npu_present
from vllm_ascend_ext.tools import npu_parity  # noqa: F401 - first: it lists the cases in SMOKE
from vllm_ascend_ext.tools import npu_parity_layers as layers

pytestmark = [pytest.mark.npu,
              pytest.mark.skipif(not npu_present(), reason="needs an Ascend NPU and torch_npu")]


@pytest.mark.parametrize("case", ["rms_norm", "add_rms_norm", "gemma_rms_norm"])
def test_norms_match_reference(case):
    _check(getattr(layers, case)())


@pytest.mark.parametrize("case", ["qwen3", "qwen3_next", "interleave"])
def test_mrope_matches_reference(case):
    _check(layers.mrope(case))


def test_add_rms_norm_dynamic_quant_matches_reference():
    _check(layers.add_rms_norm_dynamic_quant())


def test_moe_experts_w8a8_fused_match_reference():
    _check(layers.moe_experts_w8a8_fused())


def test_w8a8_mlp_activation_matches_reference():
    _check(layers.w8a8_mlp_activation())
