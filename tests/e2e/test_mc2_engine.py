"""The MC2 dispatcher (moe/mc2.py) end to end: two DP engines with expert parallelism
pretending an Atlas A3, their MoE layers exchanging tokens through
``npu_moe_distribute_dispatch_v2`` / ``combine_v2`` (emulated over the EP group's gloo
collectives, as HCCL carries them on the NPU) instead of vLLM's all-gather. The tiny Qwen
MoE at hidden size 1024 (``qwen-moe-wide``: the operators document H >= 1024 on A3), bf16
(the operators take bf16/fp16 only), a step budget within the documented 512 tokens per
rank. One engine serving every prompt is the reference."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import run_script

pytestmark = pytest.mark.e2e

A3 = {"ASCEND_EXT_SOC": "ascend910_9391"}
ARGS = ("--model", "qwen-moe-wide", "--dtype", "bfloat16", "--max-num-batched-tokens", "256")


@pytest.fixture(scope="module")
def one_engine():
    return run_script("run_dp.py", "--dp", "1", *ARGS, emulate=True, **A3)


def _max_lp_diff(a: dict, b: dict) -> float:
    return max(abs(x - y) for la, lb in zip(a["logprobs"], b["logprobs"]) for x, y in zip(la, lb))


def test_dp2_ep2_through_mc2_equals_one_engine_with_no_contract_violation(one_engine):
    """Every MoE layer of both ranks takes MC2 (the gate's default, ``auto``); every
    torch_npu call is checked against its schema, official meta and documented rules on
    each rank (contract mode, pretending A3): no violation, the dispatch and combine
    called on both ranks and layers. The greedy tokens equal one engine's; the logprobs
    agree within bf16 noise (the nightly's bf16 bound, 5e-2: measured 0 to 3.3e-2, the
    grouped matmuls seeing other rows beside a token's than in one engine)."""
    two = run_script("run_dp.py", "--dp", "2", "--ep", *ARGS, emulate=True,
                     ASCEND_EXT_NPU_CONTRACT="1", **A3)
    assert [r["mc2_layers"] for r in two["ranks"]] == [2, 2]
    assert [r["expert_shard"] for r in two["ranks"]] == ["experts [0, 4) of 8",
                                                         "experts [4, 8) of 8"]
    for rank in two["ranks"]:
        contract = rank["contract"]
        assert contract["violations"] == 0, contract["summary"]
        for op in ("npu_moe_distribute_dispatch_v2", "npu_moe_distribute_combine_v2"):
            assert contract["calls"].get(op, 0) > 0, (op, contract["summary"])
        # MC2 replaces the local permutation: no init-routing / unpermute on these layers
        assert "npu_moe_token_unpermute" not in contract["calls"], contract["summary"]
    assert one_engine["tokens"] == two["tokens"]
    assert _max_lp_diff(one_engine, two) < 5e-2


def test_negative_control_pairs_dispatched_to_the_wrong_experts_change_the_tokens(one_engine):
    """The same MC2 run with every (token, k) pair sent to the expert L ids on (the other
    rank's expert in the same slot): the tokens change."""
    broken = run_script("run_dp.py", "--dp", "2", "--ep", "--mc2-rotate-experts", *ARGS,
                        emulate=True, **A3)
    assert [r["mc2_layers"] for r in broken["ranks"]] == [2, 2]
    assert broken["tokens"] != one_engine["tokens"]
