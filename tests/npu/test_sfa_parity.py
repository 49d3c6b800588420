"""NPU parity for the SFA-side operators and the K3 op (skipped without an Ascend NPU).

Each torch_npu call (through the plugin's ``*_npu`` functions) against the plugin's
reference on the same bf16 inputs, at DeepSeek-V3.2's real widths (latent 512, rope 64,
indexer key 128), with the caches and weight formats the engine passes (separate
contiguous latent / rope / indexer-key caches; FRACTAL_NZ prolog weights). The cases
live in ``vllm_ascend_ext/tools/npu_parity.py``; each test prints what it measured.
"""

from __future__ import annotations

import pytest

from tests.npu.test_parity import _check
from vllm_ascend_ext.platform.probe import npu_present
from vllm_ascend_ext.tools import npu_parity

pytestmark = [pytest.mark.npu,
              pytest.mark.skipif(not npu_present(), reason="needs an Ascend NPU and torch_npu")]


def test_kv_rmsnorm_rope_cache_matches_reference():
    _check(npu_parity.kv_rmsnorm_rope_cache())


def test_lightning_indexer_selects_the_reference_scores():
    _check(npu_parity.lightning_indexer())


def test_sparse_flash_attention_matches_reference():
    _check(npu_parity.sparse_flash_attention())


def test_w8a8_quant_ops_match_reference():
    _check(npu_parity.w8a8_quant_ops())


def test_k3_prolog_npu_kernel_matches_the_cpu_kernel():
    _check(npu_parity.k3_prolog())


@pytest.mark.parametrize("quantized", [False, True])
def test_mla_prolog_v3_with_nz_weights_matches_reference(quantized):
    _check(npu_parity.mla_prolog_v3(quantized))
