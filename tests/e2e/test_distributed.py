"""Tensor parallelism through the plugin's device communicator (distributed/
communicator.py) on the emulated Atlas engine path: two worker processes, each the NPU
worker on the CPU stand-in, their groups' collectives on gloo (HCCL on an NPU)."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import run_script

pytestmark = pytest.mark.e2e


@pytest.mark.xdist_group("tp")
def test_tp2_equals_tp1_and_a_dropped_all_reduce_changes_the_tokens():
    """Tiny Qwen MoE in fp32 (attention heads, dense projections and the experts split
    over two ranks, partial sums all-reduced): the same greedy tokens as one rank, the
    logprobs within fp32 summation-order noise; every rank's tensor- and expert-parallel
    groups run the plugin's communicator. Negative control: all-reduce returning its input
    (each rank keeps its own partial sums) changes the tokens."""
    one = run_script("run_tp.py", "--tp", "1", emulate=True)
    two = run_script("run_tp.py", "--tp", "2", emulate=True)
    assert [r["tp_rank"] for r in two["ranks"]] == [0, 1]
    for rank in two["ranks"]:
        assert rank["worker"] == "EmulatedNPUWorker" and rank["runtime"] == "cpu-npu-stand-in"
        assert rank["tp_communicator"] == rank["ep_communicator"] == "AscendCommunicator"
    assert two["tokens"] == one["tokens"]
    assert max(abs(a - b) for la, lb in zip(one["logprobs"], two["logprobs"])
               for a, b in zip(la, lb)) < 1e-4
    broken = run_script("run_tp.py", "--tp", "2", "--drop-all-reduce", emulate=True)
    assert broken["tokens"] != one["tokens"]
