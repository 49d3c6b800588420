"""NPU parity for the MoE operators (skipped without an Ascend NPU): DeepSeek-V3 routing at
its real widths (256 experts, 8 groups) and Qwen's softmax routing, dispatch, bf16 and W8A8
grouped matmuls, SwiGLU and the weighted combine. Cases: ``vllm_ascend_ext/tools/npu_parity.py``."""

from __future__ import annotations

import pytest

from tests.npu.test_parity import _check
from vllm_ascend_ext.platform.probe import npu_present
from vllm_ascend_ext.tools import npu_parity

pytestmark = [pytest.mark.npu,
              pytest.mark.skipif(not npu_present(), reason="needs an Ascend NPU and torch_npu")]


def test_moe_routing_chooses_the_reference_experts():
    _check(npu_parity.moe_routing())


@pytest.mark.parametrize("quantized", [False, True])
def test_moe_experts_match_reference(quantized):
    _check(npu_parity.moe_experts(quantized))
