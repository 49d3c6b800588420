"""The Atlas engine path in emulation: the plugin's NPU worker and NPU model runner on the
CPU stand-in of the NPU runtime, with decode graphs (FULL_DECODE_ONLY) as on an NPU.

Every emulated run of the suite is asserted to take this path (conftest.run_script);
here: decode graphs are captured and replayed with FIA's graph-task update before each
replay and give eager mode's tokens and logprobs; without the update (negative control)
a replay waits on its FIA task's event, as on an NPU (here: an error); vLLM's CPU worker
(``ASCEND_EXT_EMULATED_WORKER=cpu``, the path before the stand-in) gives the same result.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import max_logprob_gap, run_script

pytestmark = pytest.mark.e2e

CHUNKED = ("--max-num-batched-tokens", "16")


def test_decode_graphs_replay_with_fia_updates_and_equal_eager_mode(runs):
    graphs = runs(*CHUNKED, emulate=True)
    eager = runs(*CHUNKED, "--enforce-eager", emulate=True)
    engine = graphs["engine"]
    assert engine["cudagraph_mode"] == "FULL_DECODE_ONLY"
    assert engine["graph_wrapper"] == "AscendNPUGraphWrapper"
    assert engine["graphs_captured"] > 0 and engine["graph_replays"] > 0
    # two FIA layers: every replay updated both layers' tasks
    assert engine["fia_task_updates"] == 2 * engine["graph_replays"]
    assert engine["fia_task_keys"] == [engine["graphs_captured"]]   # one builder, its graphs
    assert eager["engine"]["cudagraph_mode"] == "NONE"
    assert eager["engine"]["graph_replays"] == 0
    assert graphs["tokens"] == eager["tokens"]
    assert max_logprob_gap(graphs, eager) < 1e-4


def test_graph_memory_is_measured_into_the_kv_budget_and_leaves_no_profiling_tasks(runs):
    """With the KV cache sized by the worker's profiling (no fixed size), the NPU worker
    measures the decode graphs as vLLM's does on CUDA (a temporary capture of the first
    two sizes, extrapolated) and takes exactly that from the KV budget; the
    profiling captures' FIA tasks do not outlive them, and serving is unchanged."""
    profiled = runs(*CHUNKED, "--gpu-memory-utilization", "0.05", emulate=True)
    eager = runs(*CHUNKED, "--enforce-eager", emulate=True)
    engine = profiled["engine"]
    assert engine["kv_cache_memory_bytes"] is None and engine["kv_cache_bytes"] > 0
    assert engine["graph_memory_estimate"] > 0
    assert engine["kv_cache_bytes"] == (engine["kv_budget_before_graphs"]
                                        - engine["graph_memory_estimate"])
    assert engine["fia_task_keys"] == [engine["graphs_captured"]]
    assert engine["graph_replays"] > 0 and profiled["tokens"] == eager["tokens"]
    assert max_logprob_gap(profiled, eager) < 1e-4
    fixed = runs(*CHUNKED, emulate=True)["engine"]       # a fixed KV size: nothing measured
    assert fixed["graph_memory_estimate"] is None


def test_negative_control_a_replay_without_the_fia_update_waits_on_its_event():
    # on an NPU the replay would wait forever on the FIA task's ExternalEvent
    with pytest.raises(AssertionError, match="ExternalEvent no graph-task update recorded"):
        run_script("run_llm.py", *CHUNKED, "--skip-graph-update", emulate=True)


def test_vllms_cpu_worker_and_the_npu_engine_path_agree(runs):
    npu = runs(*CHUNKED, "--enforce-eager", emulate=True)
    cpu = runs(*CHUNKED, "--enforce-eager", emulate=True, ASCEND_EXT_EMULATED_WORKER="cpu")
    assert cpu["engine"]["worker"] == "EmulatedAscendWorker"
    assert npu["tokens"] == cpu["tokens"]
    assert max_logprob_gap(npu, cpu) < 1e-5


# the same runs as tests/e2e/test_mixed_split.py (the same arguments: one engine each)
GRAPHS = ("--many", "--max-num-batched-tokens", "64")
MIXED = (*GRAPHS, "--enforce-eager")
ON = ("--mixed-split", "on")


def test_ngram_speculation_through_the_npu_runner_equals_plain_decoding(runs):
    """The rejection sampler runs on the NPU's substitutes of vLLM's Triton kernels
    (registered over vLLM's CPU ones); greedy speculation must not change a token."""
    plain = runs(*MIXED, *ON, emulate=True)
    spec = runs(*MIXED, "--ngram", *ON, emulate=True)
    assert spec["tokens"] == plain["tokens"]
    assert max_logprob_gap(spec, plain) < 1e-4


def test_negative_control_a_broken_rejection_substitute_changes_the_tokens(runs):
    plain = runs(*MIXED, *ON, emulate=True)
    broken = runs(*MIXED, "--ngram", *ON, "--break-substitute", "greedy", emulate=True)
    assert broken["tokens"] != plain["tokens"]


# seeded random sampling (a temperature and a seed per request) with ngram drafts
SAMPLED = (*GRAPHS, *ON, "--ngram", "--sample")


def test_sampled_speculation_on_the_npu_substitutes_equals_vllms_cpu_kernels(runs):
    """Random rejection sampling, expand and recovered tokens run on the NPU's substitutes
    (chunked prefill, the mixed split on) and give exactly what vLLM's own C++ kernels for
    the CPU give in their place on the same engine path: the same seeded draws, so the
    same tokens. vLLM's sampler draws as on an NPU (``forward_native``; vLLM's CPU worker
    draws otherwise, so it is no reference for sampled tokens)."""
    npu = runs(*SAMPLED, emulate=True)
    ref = runs(*SAMPLED, "--vllm-cpu-kernels", emulate=True)
    # every other request also filtered by top-k / top-p: npu_top_k_top_p on the NPU path
    # (calls after the engine started, not only the warm-up's)
    assert npu["engine"]["top_k_top_p_fused"] > npu["top_k_top_p_fused_at_start"]
    assert npu["tokens"] == ref["tokens"]
    assert max_logprob_gap(npu, ref) < 1e-4


def test_seeded_draws_do_not_depend_on_chunking(runs):
    """Chunked prefill discards partial prefills' samples and rewinds their generators by
    one draw (an NPU generator's offset, modelled by the stand-in): a chunked run with the
    mixed split and decode graphs draws what whole prompts, eager, draw."""
    chunked = runs(*SAMPLED, emulate=True)
    whole = runs("--many", "--ngram", "--sample", "--enforce-eager", emulate=True)
    assert whole["engine"]["cudagraph_mode"] == "NONE"
    assert chunked["tokens"] == whole["tokens"]
    assert max_logprob_gap(chunked, whole) < 1e-4


@pytest.mark.parametrize("which", ["random", "expand", "recovered"])
def test_negative_control_each_broken_sampling_substitute_changes_the_tokens(runs, which):
    good = runs(*SAMPLED, emulate=True)
    broken = runs(*SAMPLED, "--break-substitute", which, emulate=True)
    assert broken["tokens"] != good["tokens"]


def test_negative_control_a_broken_slot_mapping_substitute_changes_the_tokens(runs):
    good = runs(*CHUNKED, "--enforce-eager", emulate=True)
    broken = runs(*CHUNKED, "--enforce-eager", "--break-substitute", "slot_mapping",
                  emulate=True)
    assert broken["tokens"] != good["tokens"]
