"""Decode graphs under tensor and data parallelism (emulated, fp32): the plugin's
communicator passes vLLM's graph-capture context, and the collectives of a decode step
(tensor-parallel all-reduces, the DP ranks' MoE token exchange) are captured into the
graph like any other kernel and replayed on the same buffers, as HCCL's are in an
aclgraph. The CPU stand-in records each collective as one kernel of the graph
(``emulation/cpu_npu_graph.py``); every replay exchanges what the buffers hold then.

- TP2 tiny Qwen3 with decode graphs: both ranks capture and replay graphs holding the
  all-reduces, and give one engine's (TP1, eager) tokens, logprobs within fp32 noise.
- Negative controls: the same runs replaying their graphs without the captured
  collectives (each rank keeps its own partial sums, or its own tokens' experts) change
  the tokens.

DP2 tiny Qwen MoE with graphs (graphs equal to one engine) is test_distributed.py's
``test_dp2_moe_equals_one_engine``; DP2 + EP2 through the all-to-all with graphs (graph
steps take the all-gather) its ``test_dp2_ep2_through_all_to_all_equals_one_engine``; MC2
captured into graphs is test_mc2_engine.py's step-sized test.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import REPO, max_logprob_gap, run_script

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("parallel_graphs")]

TP2 = ("--dp", "1", "--tp", "2", "--model", "qwen3", "--graphs")


@pytest.fixture(scope="module")
def reference():
    cache: dict[str, dict] = {}

    def get(model: str) -> dict:       # one engine, eager
        if model not in cache:
            cache[model] = run_script("run_dp.py", "--dp", "1", "--model", model, emulate=True)
        return cache[model]
    return get


def test_tp2_decode_graphs_replay_their_all_reduces_and_equal_one_engine(reference):
    """Each of the tiny Qwen3's layers all-reduces twice (attention output, MLP output)
    and the vocabulary-parallel embedding once: every captured graph holds those
    all-reduces (Dynamo's functional form of vLLM's TP all-reduce), on both ranks."""
    layers = json.loads((REPO / "vllm_ascend_ext/models/tiny_qwen3/config.json").read_text())[
        "num_hidden_layers"]
    two = run_script("run_dp.py", *TP2, emulate=True)
    assert [r["tp_rank"] for r in two["ranks"]] == [0, 1]
    for rank in two["ranks"]:
        assert rank["tp_communicator"] == "AscendCommunicator"
        assert rank["cudagraph_mode"] == "FULL_DECODE_ONLY"
        graphs = rank["graphs"]
        assert graphs["captured"] > 0 and graphs["replays"] > 0, graphs
        assert graphs["collectives"] == ["_c10d_functional::all_reduce"], graphs
        assert graphs["collectives_per_graph"] == [2 * layers + 1], graphs
    assert two["ranks"][0]["graphs"]["replays"] == two["ranks"][1]["graphs"]["replays"]
    one = reference("qwen3")
    assert two["tokens"] == one["tokens"]
    assert max_logprob_gap(one, two) < 1e-4


@pytest.mark.parametrize("args", [TP2, ("--dp", "2", "--model", "qwen-moe", "--graphs")],
                         ids=["tp2-all-reduce", "dp2-token-exchange"])
def test_negative_control_replays_without_their_collectives_change_the_tokens(reference, args):
    broken = run_script("run_dp.py", *args, "--skip-graph-collectives", emulate=True)
    assert all(r["graphs"]["replays"] > 0 for r in broken["ranks"])
    assert broken["tokens"] != reference(args[args.index("--model") + 1])["tokens"]
