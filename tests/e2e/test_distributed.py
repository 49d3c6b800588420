"""Tensor and data parallelism through the plugin's device communicator (distributed/
communicator.py) on the emulated Atlas engine path: several worker or engine processes,
each the NPU worker on the CPU stand-in, their groups' collectives on gloo (HCCL on an
NPU). One single-engine run per model is the reference (run_dp.py --dp 1)."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import run_script

pytestmark = pytest.mark.e2e


def _max_lp_diff(a: dict, b: dict) -> float:
    return max(abs(x - y) for la, lb in zip(a["logprobs"], b["logprobs"]) for x, y in zip(la, lb))


@pytest.fixture(scope="module")
def reference():
    cache: dict[str, dict] = {}

    def get(model: str) -> dict:
        if model not in cache:
            cache[model] = run_script("run_dp.py", "--dp", "1", "--model", model, emulate=True)
        return cache[model]
    return get


@pytest.mark.xdist_group("parallel")
def test_tp2_equals_one_engine_and_a_dropped_all_reduce_changes_the_tokens(reference):
    """Tiny Qwen MoE in fp32 (attention heads, dense projections and the experts split
    over two ranks, partial sums all-reduced): the same greedy tokens as one rank, the
    logprobs within fp32 summation-order noise; every rank's tensor- and expert-parallel
    groups run the plugin's communicator. Negative control: all-reduce returning its input
    (each rank keeps its own partial sums) changes the tokens."""
    one = reference("qwen-moe")
    two = run_script("run_tp.py", "--tp", "2", emulate=True)
    assert [r["tp_rank"] for r in two["ranks"]] == [0, 1]
    for rank in two["ranks"]:
        assert rank["worker"] == "EmulatedNPUWorker" and rank["runtime"] == "cpu-npu-stand-in"
        assert rank["tp_communicator"] == rank["ep_communicator"] == "AscendCommunicator"
    assert two["tokens"] == one["tokens"]
    assert _max_lp_diff(one, two) < 1e-4
    broken = run_script("run_tp.py", "--tp", "2", "--drop-all-reduce", emulate=True)
    assert broken["tokens"] != one["tokens"]


@pytest.mark.xdist_group("parallel")
@pytest.mark.parametrize("model", ["qwen-moe", "dsa"])
def test_dp2_moe_equals_one_engine(reference, model):
    """Two DP engines (one process each, as vLLM documents offline DP) with uneven work:
    rank 0 decodes three prompts, rank 1 one short prompt and then vLLM's dummy batches.
    Their MoE layers meet through the communicator's token exchange (all-gather of the
    ranks' tokens and router logits, reduce-scatter of the partial expert outputs; the
    experts are split over the DP x TP ranks): the same greedy tokens and logprobs within
    fp32 noise as one engine running all four prompts, for the tiny Qwen MoE (FIA) and
    the tiny DeepSeek-V3.2 (SFA, the plugin's DsaMoE block)."""
    one = reference(model)
    two = run_script("run_dp.py", "--dp", "2", "--model", model, emulate=True)
    assert [r["dp_rank"] for r in two["ranks"]] == [0, 1]
    assert all(r["ep_communicator"] == "AscendCommunicator" for r in two["ranks"])
    assert two["tokens"] == one["tokens"]
    assert _max_lp_diff(one, two) < 1e-4


@pytest.mark.xdist_group("parallel")
def test_dp2_without_the_combine_sum_changes_the_tokens(reference):
    """Negative control: each rank keeps its own slice of the partial expert outputs
    without the other rank's share."""
    broken = run_script("run_dp.py", "--dp", "2", "--drop-combine-sum", emulate=True)
    assert broken["tokens"] != reference("qwen-moe")["tokens"]
