"""Contract mode end to end: every torch_npu call of a real engine step goes through its
real call site into the contract harness (torch-npu 2.13's schemas, official metas,
documented rules), with no violation and the same tokens as contract mode off."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e

BF16_CHUNKED = ("--dtype", "bfloat16", "--max-num-batched-tokens", "16")


def test_tiny_qwen3_runs_in_contract_mode_with_no_violation(runs):
    off = runs(*BF16_CHUNKED, emulate=True)
    on = runs(*BF16_CHUNKED, emulate=True, ASCEND_EXT_NPU_CONTRACT="1")
    assert "contract" not in off
    contract = on["contract"]
    assert contract["violations"] == 0
    assert contract["calls"]["npu_fused_infer_attention_score"] > 0
    assert set(contract["calls"]) == {"npu_fused_infer_attention_score", "_npu_reshape_and_cache"}
    assert contract["summary"].startswith("ascend_ext npu-contract: validated ")
    # The same reference computes both runs: identical tokens and logprobs.
    assert on["tokens"] == off["tokens"] and on["logprobs"] == off["logprobs"]
