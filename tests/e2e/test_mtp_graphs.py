"""MTP verify steps replayed as decode graphs on the FIA backend (emulated, fp32): the
embedded tiny MiMo (a dense GQA model with one MTP layer), served with
``FULL_DECODE_ONLY`` graphs as on an Atlas 800.

With MTP every decode request carries ``1 + k`` query tokens (k drafts always proposed),
so verify-only steps are uniform batches: vLLM captures graphs for multiples of ``1 + k``
tokens, and each replay's FIA graph tasks are updated with the step's host lists (query
ends every ``1 + k`` tokens, padding requests taking the graph's remaining tokens). The
draft layer itself runs eager (vLLM's drafter takes no full graphs).

32 prompts of varied length, ``max_tokens`` 12 / 9 / 6 (requests finish mid-draft), a
64-token budget (chunked prefill, mixed steps eager). The untrained MTP layer is helped by
the harness's oracle (``spec_harness.py``), so drafts are accepted and rejected raggedly.

- MTP k = 1 and k = 3 with graphs == plain decoding (graphs) == MTP k = 3 eager: tokens
  identical, logprobs within 1e-4; replays of uniform ``1 + k`` batches, padded ones
  among them; one FIA task update per layer per replay;
- bf16 with contract mode: every NPU operator call validated, graph tasks included;
- negative controls: replays without the FIA update wait on their task's event (an error
  here); replays whose FIA update reads one KV position too far (eager steps untouched)
  change the tokens; verify rows that read one KV slot too far change the tokens.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import max_logprob_gap, oracle_runs, run_script

pytestmark = pytest.mark.e2e
LOGPROB_TOL = 1e-4
WORKLOAD = ("--model", "mimo", "--many", "--max-num-batched-tokens", "64", "--ragged")
ORACLE_RATE = "0.6"
NUM_LAYERS = 2      # the tiny MiMo's attention layers (the MTP layer's runs eager)


@pytest.fixture(scope="module")
def plain():
    return run_script("run_llm.py", *WORKLOAD, emulate=True, timeout=900)


@pytest.fixture(scope="module")
def mtp(plain, tmp_path_factory):
    return oracle_runs("run_llm.py", WORKLOAD, plain, tmp_path_factory.mktemp("mtp_graphs"),
                       ORACLE_RATE)


@pytest.fixture(scope="module")
def plain_file(mtp):
    return mtp.plain_file


@pytest.mark.parametrize("k", [1, 3])
def test_mtp_verify_graphs_equal_plain_decoding(plain, mtp, k):
    res = mtp(k)
    assert plain["engine"]["cudagraph_mode"] == res["engine"]["cudagraph_mode"] == \
        "FULL_DECODE_ONLY"
    assert {len(t) for t in plain["tokens"]} == {12, 9, 6}
    assert res["tokens"] == plain["tokens"]
    assert max_logprob_gap(res, plain) < LOGPROB_TOL
    # Observed: the replays are verify-only steps (every real request with 1 + k query
    # tokens, the graph's tokens a multiple of 1 + k: vLLM's dispatch of uniform batches),
    # and some carry padding requests (0 tokens) that pad_to_graph gives the rest
    replays = res["replays"]
    assert len(replays) == res["engine"]["graph_replays"] > 0
    for r in replays:
        real = [q for q in r["q_lens"] if q]
        assert real and set(real) == {1 + k}, r
        assert r["graph_tokens"] % (1 + k) == 0 and r["graph_tokens"] >= sum(real), r
    assert any(r["graph_tokens"] > sum(r["q_lens"]) for r in replays)
    assert res["engine"]["fia_task_updates"] == NUM_LAYERS * len(replays)
    acc, vllm = res["acceptance"], res["spec_metrics"]
    assert acc["per_position"] == vllm["num_accepted_tokens_per_pos"]
    assert 0 < sum(acc["per_position"]) < acc["draft_tokens"] == k * acc["drafts"]
    assert all(n > 0 for n in acc["per_position"])
    assert res["substitute_calls"]["eagle_prepare_inputs_padded_kernel"] > 0


def test_graph_replays_equal_eager_mtp(mtp):
    graphs, eager = mtp(3), mtp(3, "--enforce-eager")
    assert eager["engine"]["cudagraph_mode"] == "NONE" and not eager["replays"]
    assert graphs["tokens"] == eager["tokens"]
    assert max_logprob_gap(graphs, eager) < LOGPROB_TOL
    assert graphs["acceptance"]["per_position"] == eager["acceptance"]["per_position"]


def test_bfloat16_mtp_graphs_under_contract_mode(mtp):
    res = mtp(1, "--dtype", "bfloat16", ASCEND_EXT_NPU_CONTRACT="1")
    assert res["contract"]["violations"] == 0, res["contract"]["summary"]
    assert res["contract"]["calls"]["npu_fused_infer_attention_score"] > 0
    # each replay's task update issues the checked functional call (ops/fia.py, .out)
    assert res["engine"]["fia_task_updates"] > 0 and res["acceptance"]["draft_tokens"] > 0


# A replay without the FIA task update (the update skipped) waits on the task's event: the
# engine-level control is test_engine_path.py's, its seam's tests/ut/attention/fia/test_fia_graph_tasks.py's.


def test_negative_control_a_replay_update_reading_one_position_too_far(mtp):
    """Only the replays' FIA task updates are wrong (eager steps keep their lists): the
    tokens differ from eager MTP, so the replays' lists decide the output."""
    res, eager = mtp(3, "--corrupt-replay-lists"), mtp(3, "--enforce-eager")
    assert res["engine"]["graph_replays"] > 0
    assert res["tokens"] != eager["tokens"]


def test_negative_control_verify_reading_one_slot_too_far(plain, mtp):
    res = mtp(3, "--corrupt-verify-slot")
    assert res["engine"]["graph_replays"] > 0
    assert res["tokens"] != plain["tokens"]
