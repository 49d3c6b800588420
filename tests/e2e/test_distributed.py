"""Tensor and data parallelism through the plugin's device communicator (distributed/
communicator.py) on the emulated Atlas engine path: several worker or engine processes,
each the NPU worker on the CPU stand-in, their groups' collectives on gloo (HCCL on an
NPU), with and without expert parallelism. One single-engine run per model is the
reference (run_dp.py --dp 1)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.e2e.conftest import REPO, child_env, max_logprob_gap, run_script
from tests.e2e.dp_prompts import MAX_TOKENS
from tests.e2e.nightly.suite import TOL
from tests.e2e.serve_checks import (
    complete,
    first_traceback,
    kill_sessions,
    server_sessions,
    tails,
    wait_healthy,
)

W8A8_DP_GAP = TOL["cpu_w8a8_dp"]

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def reference():
    cache: dict[str, dict] = {}

    def get(model: str) -> dict:
        if model not in cache:
            cache[model] = run_script("run_dp.py", "--dp", "1", "--model", model, emulate=True)
        return cache[model]
    return get


@pytest.mark.xdist_group("parallel")
def test_tp2_ep2_equals_one_engine_and_a_dropped_all_reduce_changes_the_tokens(reference):
    """Tiny Qwen MoE in fp32, TP2 with expert parallelism (attention heads and dense
    projections split over two ranks; each rank computes its 4 of the 8 experts for every
    token, vLLM all-reduces the partial sums): the same greedy tokens as one rank, the
    logprobs within fp32 summation-order noise; every rank's tensor- and expert-parallel
    groups run the plugin's communicator. Negative control: all-reduce returning its input
    (each rank keeps its own partial sums) changes the tokens."""
    one = reference("qwen-moe")
    two = run_script("run_tp.py", "--tp", "2", "--ep", emulate=True)
    assert [r["tp_rank"] for r in two["ranks"]] == [0, 1]
    assert [r["expert_shard"] for r in two["ranks"]] == ["experts [0, 4) of 8",
                                                         "experts [4, 8) of 8"]
    for rank in two["ranks"]:
        assert rank["worker"] == "EmulatedNPUWorker" and rank["runtime"] == "cpu-npu-stand-in"
        assert rank["tp_communicator"] == rank["ep_communicator"] == "AscendCommunicator"
    assert two["tokens"] == one["tokens"]
    assert max_logprob_gap(one, two) < 1e-4
    broken = run_script("run_tp.py", "--tp", "2", "--ep", "--drop-all-reduce", emulate=True)
    assert broken["tokens"] != one["tokens"]


@pytest.mark.xdist_group("parallel")
def test_tp2_ep2_sparse_attention_equals_one_engine(reference):
    """Tiny DeepSeek-V3.2 (fp32) on TP2 with expert parallelism: the SFA backend with its
    heads split over two ranks (the lightning indexer and the sparse attention per rank),
    DsaMoE with 2 of the 4 experts per rank: the same tokens as one rank, logprobs within
    fp32 noise."""
    one = reference("dsa")
    two = run_script("run_tp.py", "--tp", "2", "--ep", "--model", "dsa", emulate=True)
    assert [r["expert_shard"] for r in two["ranks"]] == ["experts [0, 2) of 4",
                                                         "experts [2, 4) of 4"]
    assert two["tokens"] == one["tokens"]
    assert max_logprob_gap(one, two) < 1e-4


@pytest.mark.xdist_group("parallel")
@pytest.mark.parametrize("model", ["dsa", "qwen-moe"])
def test_tp2_ep2_without_dp_splits_the_tokens_through_all_to_all_and_equals_one_engine(
        reference, model):
    """TP2 + EP2 without DP, ``moe_dispatch: "alltoall"`` (fp32): vLLM would keep the tokens
    replicated on both TP ranks and all-reduce the layer's partial sums; the plugin splits
    them (moe/token_split.py). Each TP rank sends its half of the step's tokens' rows to
    the rank owning their experts and gets them back (one host read per MoE layer per
    eager forward, the same count on both ranks: they meet in every layer), and an
    all-gather over TP restores every token.

    - Tiny DeepSeek-V3.2: the plugin's MoE block splits before the layer; its shared
      expert runs on the same half.
    - Tiny Qwen MoE (vLLM's block, which hands the layer every token): each layer splits
      them itself, as vLLM's modular kernel (moe/tp_split.py) whose output is reduced, so
      vLLM's runner all-reduces only the shared expert's TP partial sums. With decode
      graphs: a graph step takes the all-gather exchange over the split (its sizes equal
      on both ranks), the TP all-gather inside the graph.

    The same greedy tokens as one rank, logprobs within fp32 noise (measured 3.3e-6 DSA,
    6.3e-6 Qwen MoE). Negative controls, at their seams: the exchange planned with the
    expert maps rolled by one rank (``tests/ut/moe/test_alltoall_dispatch.py::test_a_wrong_placement_
    changes_the_output``; end to end under DP below), the layers' kernel reporting its
    output unreduced (``tests/ut/moe/test_tp_split.py::test_vllms_runner_all_reduces_only_the_shared_
    experts_of_a_split_layer``)."""
    one = reference(model)
    layers = {"dsa": 1, "qwen-moe": 2}[model]
    args = ("--dp", "1", "--tp", "2", "--ep", "--model", model, "--moe-dispatch", "alltoall")
    graphs = ("--graphs",) if model == "qwen-moe" else ()
    two = run_script("run_dp.py", *args, *graphs, emulate=True)
    assert [r["tp_rank"] for r in two["ranks"]] == [0, 1]
    assert [r["sequence_parallel_moe"] for r in two["ranks"]] == [False, False]   # vLLM's
    assert [r["sequence_parallel_layers"] for r in two["ranks"]] == [layers] * 2  # ours
    # DeepSeek's block splits before its layer; Qwen's layers split themselves
    in_layer = layers if model == "qwen-moe" else 0
    assert [r["tp_split_layers"] for r in two["ranks"]] == [in_layer] * 2
    assert [r["a2a_layers"] for r in two["ranks"]] == [layers] * 2
    reads = [r["a2a_host_reads"] for r in two["ranks"]]
    assert reads[0] == reads[1] > 0
    if graphs:
        runs = [r["graphs"] for r in two["ranks"]]
        assert all(g["replays"] == 7 for g in runs), runs
        # per MoE layer: the all-gather exchange (tokens, router logits: 2 all-gathers;
        # a reduce-scatter back), the TP all-gather of the split's finalize, the shared
        # expert's all-reduce: 5; per attention layer its output projection's all-reduce,
        # and the embedding's: 2 x 5 + 2 + 1
        assert all(g["collectives_per_graph"] == [2 * 5 + 2 + 1] for g in runs), runs
    assert two["tokens"] == one["tokens"]
    assert max_logprob_gap(one, two) < 1e-4


@pytest.mark.xdist_group("parallel")
def test_tp2_ep2_without_dp_w8a8_experts_through_all_to_all_equal_the_all_reduce():
    """Tiny DeepSeek-V3.2 W8A8 (fp32 activations, int8 experts) on TP2 + EP2 without DP:
    the all-to-all of the split tokens (each rank's int8 experts quantizing the rows it
    receives) against the same engine on the TP all-reduce (``auto``). Both TP2 layouts
    depart from one rank alike (0.15: each TP rank quantizes its slice of the attention
    and dense rows); between them only the shared expert's whole-row quantization differs:
    the same tokens, logprobs within 2e-2 (measured 9.2e-3)."""
    args = ("--dp", "1", "--tp", "2", "--ep", "--model", "dsa-w8a8")
    kept = run_script("run_dp.py", *args, emulate=True)
    split = run_script("run_dp.py", *args, "--moe-dispatch", "alltoall", emulate=True)
    assert [r["a2a_layers"] for r in kept["ranks"]] == [0, 0]
    assert [r["a2a_layers"] for r in split["ranks"]] == [1, 1]
    assert [r["sequence_parallel_layers"] for r in split["ranks"]] == [1, 1]
    assert split["tokens"] == kept["tokens"]
    assert max_logprob_gap(kept, split) < 2e-2


@pytest.mark.xdist_group("parallel")
@pytest.mark.parametrize("model,tp,ep", [("qwen-moe", 1, False), ("dsa-w8a8", 1, True),
                                         ("qwen-moe", 2, True)],
                         ids=["qwen-moe", "dsa-w8a8-ep2", "qwen-moe-tp2-ep4"])
def test_dp2_moe_equals_one_engine(reference, model, tp, ep):
    """Two DP engines (one process each, as vLLM documents offline DP) with uneven work:
    rank 0 decodes three prompts, rank 1 one short prompt and then vLLM's dummy batches.
    Their MoE layers meet through the communicator's token exchange (all-gather of the
    ranks' tokens and router logits, reduce-scatter of the partial expert outputs): the
    same greedy tokens and logprobs within fp32 noise as one engine running all four
    prompts. Tiny Qwen MoE (FIA): the experts split over DP x TP by intermediate size.
    Tiny DeepSeek-V3.2 W8A8 (SFA, DsaMoE, int8 experts) with expert parallelism: each rank
    computes its 2 of the 4 experts for both ranks' tokens. Tiny Qwen MoE on DP2 x TP2 with
    expert parallelism over the four ranks: vLLM runs the MoE layers sequence-parallel
    (each TP rank takes half its engine's tokens, the EP group exchanges the halves, the
    model all-gathers over TP), each rank computing 2 of the 8 experts. The Qwen MoE runs
    start as a user's would, without --enforce-eager: decode steps replay graphs on every
    rank, each holding its MoE layers' exchange (two all-gathers, one reduce-scatter per
    layer; sequence-parallel under TP2, beside the TP all-reduces and all-gathers). Rank
    1's own prompt decodes 2 steps; it replays as many graphs as rank 0 (7 decode steps),
    so its dummy batches replay too. The model compiles as on an NPU: the MoE layers, their
    exchange included, run inside vLLM's opaque moe_forward op."""
    one = reference(model)
    graphs_on = model == "qwen-moe"
    two = run_script("run_dp.py", "--dp", "2", "--tp", str(tp), "--model", model,
                     *(["--ep"] if ep else []), *(["--graphs"] if graphs_on else []),
                     emulate=True)
    if graphs_on:
        assert {(r["cudagraph_mode"], r["compilation_mode"]) for r in two["ranks"]} == {
            ("FULL_DECODE_ONLY", "VLLM_COMPILE")}
        layers = json.loads((REPO / "vllm_ascend_ext/models/tiny_qwen_moe/config.json")
                            .read_text())["num_hidden_layers"]
        graphs = [r["graphs"] for r in two["ranks"]]
        decode_steps = max(MAX_TOKENS) - 1
        assert all(g["replays"] == decode_steps for g in graphs), graphs
        for g in graphs:
            assert {"c10d::_allgather_base_", "c10d::_reduce_scatter_base_"} <= set(
                g["collectives"]), g
            if tp == 1:
                assert g["collectives"] == ["c10d::_allgather_base_",
                                            "c10d::_reduce_scatter_base_"]
                assert g["collectives_per_graph"] == [3 * layers], g
    assert [(r["dp_rank"], r["tp_rank"]) for r in two["ranks"]] == [
        (d, t) for d in range(2) for t in range(tp)]
    assert all(r["ep_communicator"] == "AscendCommunicator" for r in two["ranks"])
    shards = [r["expert_shard"] for r in two["ranks"]]
    want = {"qwen-moe": ["all 8 experts"] * 2,
            "dsa-w8a8": ["experts [0, 2) of 4", "experts [2, 4) of 4"],
            "qwen-moe-tp2-ep4": [f"experts [{2 * r}, {2 * r + 2}) of 8" for r in range(4)]}
    assert shards == want[model if tp == 1 else "qwen-moe-tp2-ep4"]
    assert all(r["sequence_parallel_moe"] == (tp > 1) for r in two["ranks"])
    assert two["tokens"] == one["tokens"]
    assert max_logprob_gap(one, two) < 1e-4


@pytest.mark.xdist_group("parallel")
def test_dp2_ep2_with_mtp_equals_one_engine(reference, tmp_path):
    """DeepSeek-V3.2 W8A8 on DP2 + EP2 with MTP k = 3: the draft layer's MoE meets the other
    rank's in every draft step (the idle rank's dummy drafts included), the verify steps'
    in every target step. The untrained MTP layer is helped by the harness's oracle in
    each worker (a fixed 60% of proposals from the one-engine run), so drafts are accepted
    at every position on the busy rank: the same tokens and logprobs as one engine without
    speculation."""
    one = reference("dsa-w8a8")
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(one))
    two = run_script("run_dp.py", "--dp", "2", "--ep", "--model", "dsa-w8a8", "--mtp", "3",
                     "--oracle", str(plain), "0.6", emulate=True)
    assert [r["expert_shard"] for r in two["ranks"]] == ["experts [0, 2) of 4",
                                                         "experts [2, 4) of 4"]
    assert two["tokens"] == one["tokens"]
    # A verify step computes a token's row in a 4-row request where one engine decoded it
    # alone: the matmuls before its dynamic int8 quantization reduce in another order
    # (2.9e-6 apart with the reference norms), and an activation at a rounding boundary may
    # take the neighbouring int8 step (6.5e-3 with the compiled norms): the W8A8 noise the
    # nightly's DP gate allows (tests/e2e/nightly/suite.py TOL["cpu_w8a8_dp"]).
    # (measured: 25 of 27 within 3.3e-6, two at 4.3e-3 and 6.5e-3). A drift of every
    # token, not a rounding step here and there, fails the second bound.
    assert max_logprob_gap(one, two) < W8A8_DP_GAP
    gaps = [abs(a - b) for pa, pb in zip(one["logprobs"], two["logprobs"])
            for a, b in zip(pa, pb, strict=True)]
    assert sum(g <= 1e-4 for g in gaps) >= 0.75 * len(gaps), sorted(gaps)
    busy, idle = (r["acceptance"] for r in two["ranks"])
    assert busy["draft_tokens"] == 3 * busy["drafts"] and idle["drafts"] > 0
    # the idle rank's dummy batches ran its drafter too (its MoE met the busy rank's)
    assert two["ranks"][1]["dummy_drafts"] > 0
    assert all(n > 0 for n in busy["per_position"])
    assert sum(busy["per_position"]) < busy["draft_tokens"]     # rejected drafts too


@pytest.mark.xdist_group("parallel")
def test_dp2_ep2_w8a8_in_contract_mode_has_no_violation():
    """The same DP2 + EP2 DeepSeek-V3.2 W8A8 engines in bf16 with every torch_npu call
    checked against torch-npu 2.13's schemas, metas and documented rules on each rank: no
    violation; the expert-parallel grouped matmuls are counted as the one departure from
    the docs the plugin makes on purpose (groups ending before the rows)."""
    two = run_script("run_dp.py", "--dp", "2", "--ep", "--model", "dsa-w8a8", "--dtype",
                     "bfloat16", emulate=True, ASCEND_EXT_NPU_CONTRACT="1")
    for rank in two["ranks"]:
        contract = rank["contract"]
        assert contract["violations"] == 0, contract["summary"]
        for op in ("npu_moe_init_routing_v2", "npu_grouped_matmul_swiglu_quant",
                   "npu_grouped_matmul", "npu_moe_token_unpermute"):
            assert contract["calls"].get(op, 0) > 0, (op, contract["summary"])
        assert ("departures from the docs, made on purpose: npu_grouped_matmul: groups "
                "ending before x's rows (expert parallelism)") in contract["summary"]


@pytest.mark.xdist_group("parallel")
def test_dp2_negative_control_changes_the_tokens(reference):
    """Negative control of the DP runs above: each rank keeps its own slice of the partial
    expert outputs without the other rank's share (Qwen MoE, DP2). A rank computing with
    another rank's expert shard is shown at its seam
    (``tests/ut/moe/test_expert_parallel.py::test_a_rank_with_another_ranks_shard_is_wrong``)."""
    broken = run_script("run_dp.py", "--dp", "2", "--model", "qwen-moe", "--drop-combine-sum",
                        emulate=True)
    assert broken["tokens"] != reference("qwen-moe")["tokens"]


@pytest.mark.xdist_group("parallel")
@pytest.mark.parametrize("model", ["qwen-moe", "dsa-w8a8"])
def test_dp2_ep2_through_all_to_all_equals_one_engine(reference, model):
    """``ascend_ext.moe_dispatch: "alltoall"`` (moe/alltoall.py): every MoE layer of both DP
    ranks sends each (token, k) row only to the rank owning its expert over the
    communicator's all_to_all_v and gets the results back, the idle rank's dummy batches
    included. Tiny Qwen MoE (float experts) and tiny DeepSeek-V3.2 W8A8 (int8 experts,
    the rows quantized where they arrive): the same greedy tokens and logprobs within fp32
    noise as one engine. The dispatcher's host reads are counted in each worker: one per
    MoE layer per eager forward (a multiple of the layers, the same on both ranks: they
    meet in every layer). Started without --enforce-eager: Qwen MoE's decode steps replay
    graphs, which take the all-gather (a graph cannot hold the all-to-all's host-read
    sizes) and hold no host read; DeepSeek-V3.2 (SFA) runs eager."""
    one = reference(model)
    two = run_script("run_dp.py", "--dp", "2", "--ep", "--model", model,
                     "--moe-dispatch", "alltoall", "--graphs", emulate=True)
    graphs = [r["graphs"] for r in two["ranks"]]
    if model == "qwen-moe":
        # every decode step of rank 0 a replay on both ranks (rank 1's dummy batches too)
        assert all(g["replays"] == max(MAX_TOKENS) - 1 for g in graphs), graphs
        assert all(g["collectives"] == ["c10d::_allgather_base_", "c10d::_reduce_scatter_base_"]
                   for g in graphs), graphs
    else:
        assert graphs == [{"captured": 0, "replays": 0, "collectives": [],
                           "collectives_per_graph": []}] * 2
    layers = [r["a2a_layers"] for r in two["ranks"]]
    assert layers[0] == layers[1] > 0 and all(r["mc2_layers"] == 0 for r in two["ranks"])
    reads = [r["a2a_host_reads"] for r in two["ranks"]]
    assert reads[0] == reads[1] > 0 and reads[0] % layers[0] == 0
    assert two["tokens"] == one["tokens"]
    assert max_logprob_gap(one, two) < 1e-4


@pytest.mark.xdist_group("parallel")
def test_all_to_all_negative_control_rows_sent_to_the_wrong_rank_change_the_tokens(reference):
    """The same Qwen MoE all-to-all run with every rank planning its exchange with the
    expert maps rolled by one rank: rows reach the rank holding other experts."""
    broken = run_script("run_dp.py", "--dp", "2", "--ep", "--model", "qwen-moe",
                        "--moe-dispatch", "alltoall", "--a2a-roll-placement", emulate=True)
    assert all(r["a2a_layers"] > 0 for r in broken["ranks"])
    assert broken["tokens"] != reference("qwen-moe")["tokens"]


def _serve(model: str, port: int | None, rpc: int, log, *, headless: bool) -> subprocess.Popen:
    """One "node" of vLLM's documented multi-node DP: DP2, one local rank each, over
    loopback; the first serves the API, the second (``--headless``) only its engine."""
    env = child_env(emulate=True, VLLM_CPU_OMP_THREADS_BIND="nobind")
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")     # as a user's server runs
    # no --enforce-eager: DP engines replay decode graphs (emulated, uncompiled)
    cmd = [sys.executable, "-m", "vllm_ascend_ext", "serve", model, "--dtype", "float32",
           "--max-model-len", "512", "--seed", "0",
           "--enable-expert-parallel", "--data-parallel-size", "2",
           "--data-parallel-size-local", "1", "--data-parallel-address", "127.0.0.1",
           "--data-parallel-rpc-port", str(rpc)]
    cmd += ["--headless", "--data-parallel-start-rank", "1"] if headless else ["--port", str(port)]
    return subprocess.Popen(cmd, cwd=str(REPO), env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


@pytest.mark.xdist_group("parallel")
def test_two_nodes_on_loopback_serve_dp2_ep2_and_stop_cleanly(reference, tmp_path):
    """Two processes launched the way vLLM documents multi-node data parallelism (node 0:
    API server and DP rank 0; node 1: ``--headless``, DP rank 1), talking over loopback,
    tiny Qwen MoE with expert parallelism: the OpenAI server's greedy completions equal one
    engine's (the prompts run concurrently, so both ranks' engines get work), and both
    processes stop cleanly on SIGTERM, the API node first, leaving no process behind."""
    from tests.e2e.dp_prompts import MAX_TOKENS, PROMPTS
    from tests.e2e.nightly.serving import free_port
    from vllm_ascend_ext.models import tiny_qwen_moe_path

    one = reference("qwen-moe")
    model, port, rpc = tiny_qwen_moe_path(), free_port(), free_port()
    paths = [tmp_path / f"node{i}.log" for i in range(2)]
    nodes, sessions = [], set()
    try:
        for i, path in enumerate(paths):
            with open(path, "a") as log:        # the child keeps its own handle
                nodes.append(_serve(model, port, rpc, log, headless=i == 1))
        wait_healthy(nodes, port, paths)
        sessions = server_sessions(nodes)
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            got = list(pool.map(lambda i: complete(port, model, PROMPTS[i], MAX_TOKENS[i]),
                                range(len(PROMPTS))))
        time.sleep(5)    # the DP engines finish their wave (dummy batches) before the stop
        codes = []
        for node in nodes:                      # the API node first, then the headless one
            node.send_signal(signal.SIGTERM)
            codes.append(node.wait(timeout=120))
    finally:
        sessions |= server_sessions(nodes)
        for node in nodes:
            if node.poll() is None:
                node.send_signal(signal.SIGTERM)
                try:
                    node.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    node.kill()
        left = kill_sessions(sessions)
    assert [g["tokens"] for g in got] == one["tokens"]
    assert max(abs(a - b) for g, ref in zip(got, one["logprobs"])
               for a, b in zip(g["logprobs"], ref)) < 1e-4
    assert codes == [0, 0], tails(paths)
    assert not left, left
    tracebacks = [first_traceback(path) for path in paths]
    assert not any(tracebacks), "\n----\n".join(tracebacks)
