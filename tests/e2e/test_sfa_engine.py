"""The tiny DeepSeek-V3.2-style model end to end through the plugin's SFA backend.

Real vLLM on the CPU (emulated platform), chunked prefill (64-token budget),
prompts of 128+ tokens against ``index_topk=32``. The engine's greedy tokens and
logprobs are checked against an independent float64 forward of the same weights
(``dense_dsa.py``); negative controls must change the result.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import max_logprob_gap, run_script
from tests.e2e.dense_dsa import DenseDSA
from vllm_ascend_ext.models import tiny_dsa_path

pytestmark = pytest.mark.e2e
# Eager (not about compilation); test_compiled_model_equals_eager is the compiled run.
CHUNKED = ("--max-num-batched-tokens", "64", "--min-words", "130", "--count-ops", "--enforce-eager")
TOPK = 32


@pytest.fixture(scope="module")
def dsa():
    cache: dict[tuple, dict] = {}

    def get(*args: str) -> dict:
        if args not in cache:
            cache[args] = run_script("run_dsa.py", *args, emulate=True)
        return cache[args]

    return get


def _decode(run):
    return [s for s in run["steps"] if s["kind"] == "decode"][-1]["ops"]


def test_generates_through_the_sfa_backend_and_matches_independent_dense_math(dsa):
    r = dsa(*CHUNKED)
    assert r["model_class"] == "AscendDeepseekV32ForCausalLM" and r["backends"] == ["ASCEND_EXT_SFA"]
    assert r["moe_methods"] == ["AscendFusedMoEMethod"]   # the plugin's MoE method routes
    assert r["moe_weights_vs_checkpoint"] == 0.0           # experts as the checkpoint has them
    decode = _decode(r)                                     # one MoE layer (layer 1)
    # npu_swiglu: the routed experts', the shared expert's and the dense layer 0 MLP's
    # SiluAndMul (layer ops, docs/layer-ops.md)
    assert [decode[op] for op in ("npu_moe_gating_top_k", "npu_moe_init_routing_v2",
                                  "npu_grouped_matmul", "npu_swiglu",
                                  "npu_moe_token_unpermute")] == [1, 1, 2, 3, 1]
    assert r["chunked_prefill"] and r["block_size"] == 128
    # Three separate contiguous caches per layer (latent 128, rope 64, indexer key 128 in the
    # tiny model), all in one KV-cache group: one block table for all of them.
    (group,) = r["kv_cache_groups"]
    assert len(group) == 6 and sum(n.endswith(".k_rope_cache") for n in group) == 2
    assert all(contiguous for _, contiguous, _ in r["caches"])
    assert [shape[-1] for shape, _, _ in r["caches"][:3]] == [128, 64, 128]
    assert len({ptr for _, _, ptr in r["caches"]}) == 6
    assert [rt[0] for rt in r["routes"]] == ["native", "native"]
    assert {"prefill", "decode"} <= {s["kind"] for s in r["steps"]}
    lens = [len(p) for p in r["prompt_token_ids"]]
    assert min(lens) >= 4 * TOPK
    sel = r["selection"]                              # fewer keys selected than visible
    assert sel["calls"] > 0 and sel["max_selected"] == TOPK and sel["max_visible"] >= 4 * TOPK
    ref = DenseDSA(tiny_dsa_path())
    worst = 0.0
    for ids, toks, lps in zip(r["prompt_token_ids"], r["tokens"], r["logprobs"]):
        for (argmax, lp), tok, got in zip(ref.check(ids, toks), toks, lps):
            assert argmax == tok
            worst = max(worst, abs(lp - got))
    assert worst < 1e-4, worst


def test_negative_controls_change_the_result(dsa):
    base = dsa(*CHUNKED)
    broken = dsa(*CHUNKED, "--corrupt-block-table")
    assert broken["tokens"] != base["tokens"] and max_logprob_gap(base, broken) > 0.1
    dense = dsa(*CHUNKED, "--dense-topk")            # every visible key: sparsity matters here
    assert dense["tokens"] != base["tokens"] and max_logprob_gap(base, dense) > 0.1
    # experts chosen without the routing bias: at its seam, tests/ut/moe/test_moe_method.py::
    # test_ignoring_the_bias_or_the_groups_changes_the_routing


def test_w8a8_model_takes_the_fused_prolog_and_matches_the_native_chain(dsa):
    fused = dsa(*CHUNKED, "--quantized")
    native = dsa(*CHUNKED, "--quantized", "--preprocess", "native")
    assert fused["quant"] == "ascend_ext"             # selected from quant_model_description.json
    assert {rt[0] for rt in fused["routes"]} == {"prolog_v3"}
    assert "w8a8_dynamic" in fused["routes"][0][1]
    # Routed experts quantized too: int8 grouped matmuls after per-row dynamic quantisation.
    assert fused["moe_methods"] == native["moe_methods"] == ["AscendW8A8FusedMoEMethod"]
    assert fused["moe_weights_vs_checkpoint"] == 0.0      # int8 x scale, shards and experts in place
    # A2 (the emulated default): every int8 weight in FRACTAL_NZ, as the NPU takes it, and
    # the prolog shares the linears' weights: no ND copy resident beside an NZ one.
    assert set(fused["int8_weight_formats"]) == {"FRACTAL_NZ"}
    assert fused["prolog_nd_copies"] == 0 and fused["fallback_bytes_freed"] == 0
    assert {rt[0] for rt in native["routes"]} == {"native"}
    assert _decode(fused)["npu_mla_prolog_v3"] == 2 and "npu_mla_prolog_v3" not in _decode(native)
    assert fused["tokens"] == native["tokens"]
    assert max_logprob_gap(fused, native) < 1e-4
    float_run = dsa(*CHUNKED)
    assert fused["tokens"] != float_run["tokens"]     # the quantized weights are really used


def test_w8a8_dense_layer_fuses_its_norm_with_the_mlp_quantization(dsa):
    """bf16 (the fused op takes fp16/bf16): the dense W8A8 layer's post-attention norm and
    the MLP's activation quantization run as one npu_add_rms_norm_dynamic_quant whose int8
    output gate_up_proj consumes, and the W8A8 MLPs' activation as one
    npu_dequant_swiglu_quant; against vLLM's native layer ops (the path checked against
    dense math above, in fp32) the first greedy tokens are the same. Its accuracy is checked
    against independent math in tests/ut/layers/test_norm_quant.py: this tiny random W8A8 model is
    chaotic in bf16 (two bf16 runs of equal quality part ways over 8 tokens, and both leave
    fp32's tokens by the third; a one-step change of an int8 rounding moves a logprob by
    up to ~0.9 here), so only a broken route (garbage tokens) fails the bound below."""
    bf16 = (*CHUNKED, "--quantized", "--dtype", "bfloat16", "--max-tokens", "4")
    fused = dsa(*bf16)
    native = dsa(*bf16, "--layer-ops", "native")
    fused_ops, native_ops = _decode(fused), _decode(native)
    assert fused_ops["npu_add_rms_norm_dynamic_quant"] == 1      # one dense layer
    assert "npu_add_rms_norm_dynamic_quant" not in native_ops
    # the dense MLP and the MoE layer's shared expert: the activation is one
    # npu_dequant_swiglu_quant (A2), which also quantizes down_proj's input; the dense
    # MLP's own input quantization is the norm's
    assert fused_ops["npu_dequant_swiglu_quant"] == 2
    assert "npu_dequant_swiglu_quant" not in native_ops
    assert fused_ops["npu_dynamic_quant"] == native_ops["npu_dynamic_quant"] - 3
    assert fused["tokens"] == native["tokens"]
    assert max_logprob_gap(fused, native) < 1.5


def test_prefill_decode_disaggregation_moves_all_three_caches(dsa, tmp_path):
    """KV producer -> storage -> KV consumer (vLLM's ExampleConnector, layer-wise hooks).

    The consumer loads the producer's latent, rope-key and indexer-key caches for the prompts'
    full blocks, takes the fused prolog (unquantized layer on a KV consumer), disposes
    the fallback weights, and must generate what a plain engine generates. A producer
    with other weights (the W8A8 model) is the negative control.
    """
    base = dsa(*CHUNKED)
    good, wrong = tmp_path / "float", tmp_path / "w8a8"
    base_args = ("--min-words", "130", "--max-num-batched-tokens", "64", "--enforce-eager")
    # Producers prefill whole prompts: vLLM's ExampleConnector stores a request's blocks
    # once, after its first scheduled step, so a chunked producer would store partial KV.
    run_script("run_dsa.py", "--kv-role", "kv_producer", "--kv-path", str(good), "--max-tokens",
               "1", "--min-words", "130", "--enforce-eager", emulate=True)
    run_script("run_dsa.py", "--kv-role", "kv_producer", "--kv-path", str(wrong), "--max-tokens",
               "1", "--min-words", "130", "--quantized", "--enforce-eager",
               emulate=True)
    consumer = run_script("run_dsa.py", "--kv-role", "kv_consumer", "--kv-path", str(good),
                          *base_args, emulate=True)
    control = run_script("run_dsa.py", "--kv-role", "kv_consumer", "--kv-path", str(wrong),
                         *base_args, emulate=True)
    assert {rt[0] for rt in consumer["routes"]} == {"prolog_v3"}
    assert "KV consumer" in consumer["routes"][0][1]
    assert consumer["fallback_bytes_freed"] > 0 and base["fallback_bytes_freed"] == 0
    total = sum(len(p) for p in consumer["prompt_token_ids"])
    loaded = sum(len(p) // 128 * 128 for p in consumer["prompt_token_ids"])
    assert loaded > 0
    assert consumer["selection"]["first_step_tokens"] <= total - loaded   # KV came from storage
    assert consumer["tokens"] == base["tokens"] and max_logprob_gap(base, consumer) < 1e-4
    assert max_logprob_gap(base, control) > 1e-3                              # wrong KV shows


def test_per_step_counts_do_not_grow_with_depth_and_the_indexer_gemm_runs_once(dsa):
    two, one = dsa(*CHUNKED), dsa(*CHUNKED, "--layers", "1")
    d2, d1 = _decode(two), _decode(one)
    casts = {k for k in set(d1) | set(d2) if k.startswith("aten._to_copy[torch.int")}
    assert all(d1.get(k, 0) == d2.get(k, 0) for k in casts)      # slot casts: per step only
    for run, layers in ((two, 2), (one, 1)):
        for step in run["steps"][1:]:
            assert step["ops"].get("uses[wk_weights_proj]", 0) == layers, step["kind"]
    assert d2.get("aten.clone", 0) == d1.get("aten.clone", 0) == 0
    assert "aten.contiguous" not in d2
    assert d2["aten.copy_"] - d1["aten.copy_"] == 1             # one output write per layer


def test_w8a8_model_under_dummy_loading_is_deterministic():
    """vLLM leaves int8 parameters uninitialised under load_format=dummy; the plugin fills them."""
    args = ("--quantized", "--dummy", "--num-prompts", "2", "--max-tokens", "4", "--enforce-eager")
    a = run_script("run_dsa.py", *args, emulate=True, fresh=True)
    b = run_script("run_dsa.py", *args, emulate=True, fresh=True)
    assert {rt[0] for rt in a["routes"]} == {"prolog_v3"}
    assert a["tokens"] == b["tokens"] and a["logprobs"] == b["logprobs"]


def test_compiled_model_equals_eager(dsa):
    """The SFA model compiled as served (torch.compile; SFA captures no decode graphs):
    the same tokens and logprobs as the eager runs the other tests read."""
    eager = dsa(*CHUNKED)
    compiled = dsa(*(a for a in CHUNKED if a != "--enforce-eager"))
    assert compiled["backends"] == ["ASCEND_EXT_SFA"] and compiled["steps"]
    assert compiled["tokens"] == eager["tokens"]
    assert max_logprob_gap(compiled, eager) < 1e-4
