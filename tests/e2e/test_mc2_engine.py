"""The MC2 dispatcher (moe/mc2.py) end to end: two DP engines with expert parallelism
pretending an Atlas A3, their MoE layers exchanging tokens through
``npu_moe_distribute_dispatch_v2`` / ``combine_v2`` (emulated over the EP group's gloo
collectives, as HCCL carries them on the NPU) instead of vLLM's all-gather, in bf16 (the
operators take bf16/fp16 only) at hidden size 1024 (the operators document H >= 1024 on
A3). One engine serving every prompt is the reference.

- The tiny DeepSeek-V3.2 W8A8 (``dsa-w8a8-wide``), a step budget within the documented
  512 tokens per rank: MC2 every step, the int8 experts quantizing the rows MC2 delivers.
- The tiny Qwen MoE (``qwen-moe-wide``, float experts) with a step budget above those 512
  tokens: the plan is step-sized, a 600-token prompt makes a prefill-sized step, which
  takes the all-gather (or all-to-all, where asked), and the decode steps take MC2.
- DeepSeek-V3.2 sequence-parallel under TP2: DP2 x TP2 + EP4 (vLLM's sequence-parallel
  MoE) and TP2 + EP2 without DP (the plugin's block splitting the tokens,
  ``moe/token_split.py``), against one TP2 engine.
- The tiny Qwen MoE on TP2 + EP2 without DP: each of vLLM's MoE layers splitting the
  tokens itself (``moe/tp_split.py``), against one engine."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import greedy_departures, run_script
from tests.e2e.dp_prompts import MAX_TOKENS

pytestmark = pytest.mark.e2e

A3 = {"ASCEND_EXT_SOC": "ascend910_9391"}
# One bf16 ulp of the tiny wide models' largest logits (magnitude in [8, 16): 2^-4), and a
# little for the log-sum-exp it moves: two runs whose hidden states differ within bf16
# noise (another exchange's roundings) may round one logit to the neighbouring bf16 value.
# The runs' own gaps show it: 0.0626 and 0.0611, one ulp each (measured on the 2-core
# machine; 6e-2, which an earlier machine measured as the noise, is below one ulp).
BF16_LOGIT_ULP_GAP = 2.0**-4 + 4e-3
# The tiny Qwen MoE's step-sized runs against one engine, eager bf16 as on an NPU: since the
# emulated platform is the NPU platform, every run compiles with the NPU's eager backend
# (each op rounds to bf16, as an NPU's eager ops do; vLLM's CPU platform fused pointwise
# ops in fp32 with inductor, and ran the DP/EP runs uncompiled) and the gaps grew to two
# ulps of the logits: measured 0.083 (DP2, all-to-all prefill steps) and 0.132 (TP2 + EP2),
# the tokens equal up to near ties. Three ulps, for another machine's BLAS blocking.
BF16_EAGER_TWO_RANK_GAP = 3 * 2.0**-4 + 4e-3
W8A8 = ("--model", "dsa-w8a8-wide", "--dtype", "bfloat16", "--max-num-batched-tokens", "256")


def test_dsa_w8a8_dp2_ep2_through_mc2_equals_one_engine_with_no_contract_violation():
    """Every MoE layer of both ranks takes MC2 every step (the gate's default, ``auto``);
    the W8A8 experts run vllm-ascend's fused sequence over the rows MC2 delivers
    (``npu_dynamic_quant``, ``npu_grouped_matmul_swiglu_quant``, ``npu_grouped_matmul``);
    every torch_npu call is checked against its schema, official meta and documented rules
    on each rank (contract mode, pretending A3): no violation. The greedy tokens equal one
    engine's and so do the logprobs, within 1e-3 (measured: equal; each row is quantized
    by itself, as on one rank, and MC2's combine sums a token's rows in fp32 once)."""
    one = run_script("run_dp.py", "--dp", "1", *W8A8, emulate=True, **A3)
    two = run_script("run_dp.py", "--dp", "2", "--ep", *W8A8, emulate=True,
                     ASCEND_EXT_NPU_CONTRACT="1", **A3)
    assert [r["mc2_layers"] for r in two["ranks"]] == [1, 1]
    assert [r["expert_shard"] for r in two["ranks"]] == ["experts [0, 2) of 4",
                                                         "experts [2, 4) of 4"]
    for rank in two["ranks"]:
        contract = rank["contract"]
        assert contract["violations"] == 0, contract["summary"]
        calls = contract["calls"]
        steps = calls["npu_moe_gating_top_k"]          # one MoE layer: one routing per step
        for op in ("npu_moe_distribute_dispatch_v2", "npu_moe_distribute_combine_v2",
                   "npu_grouped_matmul_swiglu_quant"):
            assert calls.get(op) == steps, (op, contract["summary"])
        # MC2 replaces the local permutation: no init-routing / unpermute on these layers
        assert "npu_moe_token_unpermute" not in calls, contract["summary"]
        assert "npu_moe_init_routing_v2" not in calls, contract["summary"]
    assert one["tokens"] == two["tokens"]
    assert greedy_departures(one, two, 1e-3) == []


LONG = ("--model", "qwen-moe-wide", "--dtype", "bfloat16", "--max-num-batched-tokens", "1024",
        "--long-prompt", "600")


@pytest.fixture(scope="module")
def one_engine_long():
    return run_script("run_dp.py", "--dp", "1", *LONG, emulate=True, **A3)


def test_negative_control_pairs_dispatched_to_the_wrong_experts_change_the_tokens(
        one_engine_long):
    """The step-sized run with every (token, k) pair of the MC2 steps sent to the expert L
    ids on (the other rank's expert in the same slot): the tokens change, beyond what the
    noise-aware comparison of the step-sized test lets through."""
    broken = run_script("run_dp.py", "--dp", "2", "--ep", "--mc2-rotate-experts", *LONG,
                        emulate=True, **A3)
    assert [r["mc2_layers"] for r in broken["ranks"]] == [2, 2]
    assert broken["tokens"] != one_engine_long["tokens"]
    assert greedy_departures(one_engine_long, broken, 6e-2) != []


@pytest.mark.parametrize("dispatch", ["auto", "alltoall"])
def test_a_step_sized_plan_takes_mc2_for_decode_and_another_exchange_for_prefill(
        one_engine_long, dispatch):
    """A 1024-token budget, above MC2's 512 tokens per rank on A3: each layer plans MC2
    for decode-sized steps, and the steps with more tokens on some rank (the start-up
    profile run, the step holding the 600-token prompt) take the all-gather the layer runs
    itself (``auto``) or the all-to-all (``alltoall``, one host read per layer and such
    step). Contract mode on both ranks: no violation; both routes called on both ranks,
    the same number of times on each (collectives). The result departs from one engine
    only within bf16 noise: logprobs within 6e-2 up to a near tie, where the runs may pick
    either token (vLLM's check_logprobs_close; the exchange's roundings differ: the
    all-gather route rounds each rank's partial sum to bf16 before the reduce-scatter adds
    them, measured up to 6e-2 with vLLM's own all-gather in the same run). Started without
    --enforce-eager: decode steps replay graphs holding the MC2 dispatch and combine (as
    an aclgraph holds them on A3), on both ranks alike; the counts below are the calls
    the plugin made (eager steps and captures), not replays."""
    two = run_script("run_dp.py", "--dp", "2", "--ep", *LONG, "--moe-dispatch", dispatch,
                     "--graphs", emulate=True, ASCEND_EXT_NPU_CONTRACT="1", **A3)
    assert [r["mc2_layers"] for r in two["ranks"]] == [2, 2]
    graphs = [r["graphs"] for r in two["ranks"]]
    # every decode step a replay on both ranks (rank 1's dummy batches too)
    assert all(g["replays"] == max(MAX_TOKENS) - 1 for g in graphs), graphs
    assert all(r["cudagraph_mode"] == "FULL_DECODE_ONLY" for r in two["ranks"])
    calls = [{op: n for op, n in r["contract"]["calls"].items() if op.startswith("npu_moe")}
             for r in two["ranks"]]
    for rank in two["ranks"]:
        assert rank["contract"]["violations"] == 0, rank["contract"]["summary"]
    # every MoE layer's collectives met on both ranks: the same MC2 calls and routings
    met = ("npu_moe_distribute_dispatch_v2", "npu_moe_distribute_combine_v2",
           "npu_moe_gating_top_k_softmax")
    assert [{op: c.get(op, 0) for op in met} for c in calls] == [
        {op: calls[0].get(op, 0) for op in met}] * 2, calls
    mc2 = calls[0]["npu_moe_distribute_dispatch_v2"]
    assert mc2 > 0 and mc2 == calls[0]["npu_moe_distribute_combine_v2"]
    # exactly two steps bring more than 512 tokens to a rank: the start-up profile run (1024)
    # and the 600-token prompt's: 2 steps x 2 layers took the other route, every other
    # layer-step MC2
    large = 2 * 2
    assert calls[0]["npu_moe_gating_top_k_softmax"] == mc2 + large
    reads = [r["a2a_host_reads"] for r in two["ranks"]]
    routings = [c["npu_moe_init_routing_v2"] for c in calls]
    if dispatch == "auto":           # the all-gather: one init-routing per layer-step
        assert reads == [None, None] and routings == [large] * 2, calls
    else:
        # the all-to-all: its exchange's init-routing and host read on every rank at every
        # such layer-step; the local experts' init-routing only on a rank that received
        # rows, which depends on which rank DP's timing gave which request (some rank
        # receives each layer-step's rows)
        assert reads == [large] * 2
        local = [n - large for n in routings]
        assert all(0 <= n <= large for n in local) and sum(local) >= large, calls
    assert greedy_departures(one_engine_long, two, BF16_EAGER_TWO_RANK_GAP) == []


def test_dp2_tp2_ep4_sequence_parallel_mc2_with_one_expert_per_rank_equals_a_tp2_engine():
    """DP2 x TP2 + EP4, tiny DeepSeek-V3.2 W8A8: vLLM runs the MoE sequence-parallel (each
    TP rank dispatches its share of the engine's tokens), each rank holds one of the four
    experts (its grouped matmuls take one group, sent as a running sum), a 2048-token
    budget (1024 per TP rank) above MC2's 512 makes the plan step-sized, and an 1100-token
    prompt (550 per TP rank) makes a prefill-sized step through the all-gather. Contract
    mode on all four ranks: no violation, both routes on each rank. The reference is one
    TP2 engine (TP2 itself departs from TP1 with W8A8: each TP rank quantizes its own
    slice of a row): the same tokens, logprobs within bf16 noise (6e-2; measured 5.1e-2)."""
    args = ("--model", "dsa-w8a8-wide", "--dtype", "bfloat16",
            "--max-num-batched-tokens", "2048", "--long-prompt", "1100")
    tp2 = run_script("run_dp.py", "--dp", "1", "--tp", "2", *args, emulate=True, **A3)
    four = run_script("run_dp.py", "--dp", "2", "--tp", "2", "--ep", *args, emulate=True,
                      ASCEND_EXT_NPU_CONTRACT="1", **A3)
    assert [r["sequence_parallel_moe"] for r in four["ranks"]] == [True] * 4
    assert [r["expert_shard"] for r in four["ranks"]] == [f"experts [{e}, {e + 1}) of 4"
                                                          for e in range(4)]
    assert [r["mc2_layers"] for r in four["ranks"]] == [1] * 4
    for rank in four["ranks"]:
        contract = rank["contract"]
        assert contract["violations"] == 0, contract["summary"]
        calls = contract["calls"]
        assert calls.get("npu_moe_distribute_dispatch_v2", 0) > 0, contract["summary"]
        # two steps above 512 tokens per TP rank (the profile run, 1024; the 1100-token
        # prompt's, 550) through the all-gather (one MoE layer); every other through MC2
        assert calls.get("npu_moe_init_routing_v2") == 2, contract["summary"]
        assert calls["npu_moe_gating_top_k"] == calls["npu_moe_distribute_dispatch_v2"] + 2
    assert four["tokens"] == tp2["tokens"]
    assert greedy_departures(tp2, four, 6e-2) == []


def test_tp2_ep2_without_dp_splits_the_tokens_through_mc2_and_equals_a_tp2_engine():
    """TP2 + EP2 without DP, ``moe_dispatch: "mc2"``, tiny DeepSeek-V3.2 W8A8 pretending
    A3: vLLM would keep the tokens replicated on both TP ranks and all-reduce the layer's
    partial sums; the plugin's MoE block runs sequence-parallel instead
    (moe/token_split.py): each TP rank dispatches its half of the step's tokens through MC2
    (int8 rows), the shared expert runs on the same half, an all-gather over TP restores
    every token. A 2048-token budget (1024 per TP rank, above MC2's 512) makes the plan
    step-sized. The first step (a 600-token prompt beside the short ones, about 340 tokens
    per TP rank once split, more than 512 on each rank if it were not) takes MC2; the
    start-up profile run (1024 per rank) takes the all-gather exchange the layer runs
    itself, through the EP group's exchange the communicator sets up for this layout
    (vLLM asks for it only with DP). Contract mode on both ranks: no violation. The same
    tokens as one TP2 engine, logprobs within bf16 noise (6e-2; measured 5.3e-2: with
    the MoE split the shared expert holds whole rows, each TP rank quantizing the whole
    intermediate row rather than its slice). MC2's buffers are sized for a decode step of
    ``max_num_seqs`` requests split over TP: 1024 give 512 tokens per rank, which the
    600-token prompt's split step fits."""
    args = ("--model", "dsa-w8a8-wide", "--dtype", "bfloat16",
            "--max-num-batched-tokens", "2048", "--long-prompt", "600", "--max-num-seqs", "1024")
    tp2 = run_script("run_dp.py", "--dp", "1", "--tp", "2", *args, emulate=True, **A3)
    two = run_script("run_dp.py", "--dp", "1", "--tp", "2", "--ep", *args,
                     "--moe-dispatch", "mc2", emulate=True, ASCEND_EXT_NPU_CONTRACT="1", **A3)
    assert [r["sequence_parallel_moe"] for r in two["ranks"]] == [False, False]   # vLLM's
    assert [r["sequence_parallel_layers"] for r in two["ranks"]] == [1, 1]        # ours
    assert [r["expert_shard"] for r in two["ranks"]] == ["experts [0, 2) of 4",
                                                         "experts [2, 4) of 4"]
    assert [r["mc2_layers"] for r in two["ranks"]] == [1, 1]
    calls = [r["contract"]["calls"] for r in two["ranks"]]
    for rank in two["ranks"]:
        assert rank["contract"]["violations"] == 0, rank["contract"]["summary"]
    mc2 = calls[0].get("npu_moe_distribute_dispatch_v2", 0)
    assert mc2 > 0 and calls[0]["npu_moe_distribute_combine_v2"] == mc2
    for rank_calls in calls:
        # one step above 512 tokens per TP rank, the profile run, through the all-gather
        # (one MoE layer: one init-routing); every other step, the long prompt's included,
        # through MC2, on both ranks
        assert rank_calls["npu_moe_init_routing_v2"] == 1, rank_calls
        assert rank_calls["npu_moe_distribute_dispatch_v2"] == mc2, rank_calls
        assert rank_calls["npu_moe_gating_top_k"] == mc2 + 1, rank_calls
    assert two["tokens"] == tp2["tokens"]
    assert greedy_departures(tp2, two, 6e-2) == []


def test_tp2_ep2_without_dp_qwen_moe_layers_split_the_tokens_through_mc2(one_engine_long):
    """TP2 + EP2 without DP, ``moe_dispatch: "mc2"``, the tiny Qwen MoE (bf16, hidden 1024)
    pretending A3, with decode graphs: vLLM's MoE block hands each layer every token on
    both TP ranks; each layer splits them itself (moe/tp_split.py, vLLM's modular kernel:
    its half of the tokens through MC2, an all-gather over TP, vLLM's runner all-reducing
    the shared expert alone). A 2048-token budget (1024 per TP rank, above MC2's 512)
    makes the plan step-sized: the start-up profile run (1024 per rank) takes the
    all-gather exchange the layer runs itself, one init-routing per layer; the step
    holding the 600-token prompt (about 340 tokens per rank once split, more than 512 if
    it were not) and every decode step take MC2, the decode graphs holding it on both
    ranks. Contract mode on both ranks: no violation, the same calls on each. Against one
    engine: departures only within bf16 noise (6e-2; the prompts hold an exact bf16 tie,
    which either run may take). MC2's buffers are sized for a decode step of
    ``max_num_seqs`` requests split over TP: 1024 requests give 512 tokens per rank, so the
    600-token prompt's split step (about 340 per rank) fits them, as on an A3 serving that
    many requests (with vLLM's default it would take the all-gather: 4 init-routings)."""
    args = ("--model", "qwen-moe-wide", "--dtype", "bfloat16", "--long-prompt", "600",
            "--max-num-batched-tokens", "2048", "--max-num-seqs", "1024")
    two = run_script("run_dp.py", "--dp", "1", "--tp", "2", "--ep", *args,
                     "--moe-dispatch", "mc2", "--graphs", emulate=True,
                     ASCEND_EXT_NPU_CONTRACT="1", **A3)
    assert [r["sequence_parallel_moe"] for r in two["ranks"]] == [False, False]   # vLLM's
    assert [r["tp_split_layers"] for r in two["ranks"]] == [2, 2]
    assert [r["mc2_layers"] for r in two["ranks"]] == [2, 2]
    graphs = [r["graphs"] for r in two["ranks"]]
    assert all(g["replays"] == max(MAX_TOKENS) - 1 for g in graphs), graphs
    calls = [{op: n for op, n in r["contract"]["calls"].items() if op.startswith("npu_moe")}
             for r in two["ranks"]]
    for rank in two["ranks"]:
        assert rank["contract"]["violations"] == 0, rank["contract"]["summary"]
    assert calls[0] == calls[1]
    mc2 = calls[0]["npu_moe_distribute_dispatch_v2"]
    assert mc2 > 0 and calls[0]["npu_moe_distribute_combine_v2"] == mc2
    assert calls[0]["npu_moe_init_routing_v2"] == 2, calls[0]    # the profile run only
    assert calls[0]["npu_moe_gating_top_k_softmax"] == mc2 + 2
    assert greedy_departures(one_engine_long, two, BF16_EAGER_TWO_RANK_GAP) == []


def test_mtp_drafts_meet_in_mc2_with_a_step_sized_plan():
    """DP2 + EP2, tiny DeepSeek-V3.2 W8A8 with MTP (2 drafts per step): the drafter's MoE
    layer meets the other rank's in every draft step (dummy ones on the idle rank too),
    through the same per-step choice as the main model (1024-token budget, a 600-token
    prompt: prefill-sized steps through the all-gather, the rest through MC2). Contract
    mode: no violation; both ranks make the same MoE calls. The greedy tokens equal one
    engine's without speculation, logprobs within bf16 noise (measured 2.8e-3)."""
    args = ("--model", "dsa-w8a8-wide", "--dtype", "bfloat16",
            "--max-num-batched-tokens", "1024", "--long-prompt", "600")
    one = run_script("run_dp.py", "--dp", "1", *args, emulate=True, **A3)
    two = run_script("run_dp.py", "--dp", "2", "--ep", "--mtp", "2", *args, emulate=True,
                     ASCEND_EXT_NPU_CONTRACT="1", **A3)
    calls = [{op: n for op, n in r["contract"]["calls"].items() if op.startswith("npu_moe")}
             for r in two["ranks"]]
    for rank in two["ranks"]:
        assert rank["contract"]["violations"] == 0, rank["contract"]["summary"]
    assert calls[0] == calls[1]
    assert calls[0]["npu_moe_distribute_dispatch_v2"] > 0 and calls[0]["npu_moe_init_routing_v2"] > 0
    assert sum(r["acceptance"]["drafts"] for r in two["ranks"]) > 0
    assert one["tokens"] == two["tokens"]
    assert greedy_departures(one, two, 6e-2) == []
