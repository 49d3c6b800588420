"""The plugin's MoE method inside real vLLM (emulated) against vLLM's own CPU MoE path.

The embedded tiny Qwen MoE model (Qwen2-MoE architecture: softmax top-2 of 8 experts,
renormalised, plus a gated shared expert), realistic-scale weights, fp32, greedy, with
chunked prefill: tokens must match stock vLLM (its CPU attention and CPU fused MoE) and
logprobs agree within 1e-4; routing weights left unnormalised (negative control) must not.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import max_logprob_gap

pytestmark = pytest.mark.e2e

ARGS = ("--model", "qwen_moe", "--max-num-batched-tokens", "16", "--enforce-eager")


def test_qwen_moe_matches_vllms_cpu_moe_path(runs):
    stock, emu = runs(*ARGS, emulate=False), runs(*ARGS, emulate=True)
    assert stock["moe_methods"] == ["UnquantizedFusedMoEMethod"]
    assert emu["moe_methods"] == ["AscendFusedMoEMethod"]
    assert emu["backends"] == ["ASCEND_EXT_FIA"]
    assert emu["tokens"] == stock["tokens"]
    assert max_logprob_gap(emu, stock) < 1e-4


def test_negative_control_unnormalised_routing_changes_the_result(runs):
    stock = runs(*ARGS, emulate=False)
    bad = runs(*ARGS, "--corrupt-moe-routing", emulate=True)
    assert bad["moe_methods"] == ["AscendFusedMoEMethod"]
    assert bad["tokens"] != stock["tokens"] or max_logprob_gap(bad, stock) > 0.1
