"""Contract mode end to end: every torch_npu call of a real engine step goes through its
real call site into the contract harness (torch-npu 2.13's schemas, official metas,
documented rules), with no violation and the same tokens as contract mode off."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import run_script
from tests.e2e.hybrid_judge import BF16_STATE_TOL

pytestmark = pytest.mark.e2e

BF16_CHUNKED = ("--dtype", "bfloat16", "--max-num-batched-tokens", "16", "--enforce-eager")


def test_tiny_qwen_moe_runs_in_contract_mode_with_no_violation(runs):
    """The FIA path (GQA attention, paged K/V writes, chunked prefill) and the MoE method's
    softmax route (npu_moe_gating_top_k_softmax) with the expert operators."""
    args = ("--model", "qwen_moe", *BF16_CHUNKED)
    off = runs(*args, emulate=True)
    on = runs(*args, emulate=True, ASCEND_EXT_NPU_CONTRACT="1")
    contract = on["contract"]
    assert contract["violations"] == 0
    assert set(contract["calls"]) == ({"npu_fused_infer_attention_score", "npu_scatter_pa_kv_cache",
                                       "npu_moe_gating_top_k_softmax"} | LAYER_OPS | SAMPLER
                                      | MOE_OPS - {"npu_moe_gating_top_k"}), contract["summary"]
    assert contract["calls"]["npu_fused_infer_attention_score"] > 0
    assert contract["summary"].startswith("ascend_ext npu-contract: validated ")
    assert "contract" not in off
    # The same reference computes both runs: identical tokens and logprobs.
    assert on["tokens"] == off["tokens"] and on["logprobs"] == off["logprobs"]


@pytest.mark.parametrize("soc,gaps", [
    ("ascend910_9391", {"npu_moe_gating_top_k_softmax@A3", "npu_grouped_matmul@A3",
                        "npu_swiglu@A3"}),
    ("ascend950", {"npu_moe_gating_top_k_softmax@A5", "npu_grouped_matmul@A5", "npu_swiglu@A5",
                   "npu_moe_init_routing_v2@A5", "npu_scatter_pa_kv_cache@A5",
                   "npu_fused_infer_attention_score@A5"}),
], ids=["A3", "950"])
def test_contract_mode_pretending_a3_and_950_reports_documentation_gaps_per_soc(runs, soc, gaps):
    """End to end on the other SoC families: 0 violations; the calls the documentation
    does not list for the SoC are counted as gaps (docs/contract-mode.md's op-by-SoC table)."""
    args = ("--model", "qwen_moe", *BF16_CHUNKED)
    on = runs(*args, emulate=True, ASCEND_EXT_NPU_CONTRACT="1", ASCEND_EXT_SOC=soc)
    contract = on["contract"]
    assert contract["violations"] == 0
    listed = contract["summary"].split("documentation gaps")[1]
    assert {part.split("=")[0] for part in listed.split(": ", 1)[1].split(", ")} == gaps


def test_sampled_requests_filter_top_k_top_p_through_npu_top_k_top_p(runs):
    """Random sampling with top-k and top-p on every other request (bf16, A2): the NPU
    runner's sampler filters with npu_top_k_top_p (its documented ranges checked on every
    call), beyond the calls of vLLM's sampler warm-ups (counted once the engine has
    started); no violation."""
    on = runs("--sample", "--dtype", "bfloat16", "--enforce-eager", emulate=True,
              ASCEND_EXT_NPU_CONTRACT="1")
    contract = on["contract"]
    assert contract["violations"] == 0, contract["summary"]
    assert on["engine"]["top_k_top_p_fused"] == contract["calls"]["npu_top_k_top_p"]
    assert on["top_k_top_p_fused_at_start"] > 0          # the warm-ups take it too
    assert contract["calls"]["npu_top_k_top_p"] > on["top_k_top_p_fused_at_start"]


DSA_ARGS = ("--dtype", "bfloat16", "--max-num-batched-tokens", "64", "--min-words", "130",
            "--num-prompts", "2", "--max-tokens", "4", "--enforce-eager")
MOE_OPS = {"npu_moe_gating_top_k", "npu_moe_init_routing_v2", "npu_grouped_matmul", "npu_swiglu",
           "npu_moe_token_unpermute"}
# RMSNorm (with the residual add), RoPE and SiluAndMul on torch_npu (layers/)
LAYER_OPS = {"npu_rms_norm", "npu_add_rms_norm", "npu_mrope", "npu_swiglu"}
# the sampler's filter: vLLM's warm-up samples with top-k (vocab - 1 = 1023, in the
# operator's range) on A2/A3 (worker/npu_sampler.py)
SAMPLER = {"npu_top_k_top_p"}
NATIVE_OPS = {"npu_rms_norm", "npu_interleave_rope", "npu_kv_rmsnorm_rope_cache",
              "npu_lightning_indexer", "npu_sparse_flash_attention", "npu_add_rms_norm"} | MOE_OPS \
    | SAMPLER
# DSA's RoPE runs inside its attention ops: the layer ops are its norms and SiluAndMul.
# The W8A8 experts (FRACTAL_NZ on the default A2) take the fused first GEMM, the dense
# and shared-expert MLPs npu_dequant_swiglu_quant: no npu_swiglu is left.
PROLOG_W8A8_OPS = {"npu_format_cast", "npu_dynamic_quant", "npu_quant_matmul", "npu_mla_prolog_v3",
                   "npu_lightning_indexer", "npu_sparse_flash_attention", "npu_rms_norm",
                   "npu_add_rms_norm", "npu_add_rms_norm_dynamic_quant",
                   "npu_grouped_matmul_swiglu_quant", "npu_dequant_swiglu_quant"} | (
                       MOE_OPS - {"npu_swiglu"}) | SAMPLER


@pytest.mark.parametrize("extra,ops", [((), NATIVE_OPS), (("--quantized",), PROLOG_W8A8_OPS)],
                         ids=["dsa-native", "dsa-w8a8-prolog"])
def test_tiny_dsa_runs_in_contract_mode_with_no_violation(extra, ops):
    """SFA side: three separate contiguous caches, FRACTAL_NZ prolog weights, bf16."""
    off = run_script("run_dsa.py", *DSA_ARGS, *extra, emulate=True)
    on = run_script("run_dsa.py", *DSA_ARGS, *extra, emulate=True, ASCEND_EXT_NPU_CONTRACT="1")
    contract = on["contract"]
    assert contract["violations"] == 0
    assert set(contract["calls"]) == ops, contract["summary"]
    assert on["tokens"] == off["tokens"] and on["logprobs"] == off["logprobs"]


GDN_ARGS = ("--dtype", "bfloat16", "--num-prompts", "3", "--max-tokens", "4", "--eager",
            "--budget", "16")
GDN_OPS = {"npu_fused_infer_attention_score", "npu_scatter_pa_kv_cache",
           "npu_moe_gating_top_k_softmax", "npu_moe_init_routing_v2", "npu_grouped_matmul",
           "npu_swiglu", "npu_moe_token_unpermute",
           "npu_gemma_rms_norm", "npu_add_rms_norm"}


@pytest.mark.parametrize("soc,gaps", [("ascend910b2", set()),
                                      ("ascend950", {"npu_gemma_rms_norm@A5"})],
                         ids=["A2", "950"])
def test_tiny_qwen3_next_layer_ops_in_contract_mode(soc, gaps):
    """Qwen3-Next's Gemma RMSNorm (with and without the residual add) through its call
    sites, bf16, chunked prefill on: no violation, the same tokens as contract mode off; on
    950 the Gemma norm is a documentation gap (its docs list A2/A3). The tiny
    model's RoPE (rotary_dim 16, not a multiple of 32 in bf16) takes vLLM's native route,
    so npu_mrope is not called here (the Qwen MoE run above calls it)."""
    off = run_script("run_gdn.py", *GDN_ARGS, emulate=True)
    on = run_script("run_gdn.py", *GDN_ARGS, emulate=True, ASCEND_EXT_NPU_CONTRACT="1",
                    ASCEND_EXT_SOC=soc)
    contract = on["contract"]
    assert contract["violations"] == 0, contract["summary"]
    assert GDN_OPS <= set(contract["calls"]), contract["summary"]
    # Contract mode takes torch_npu's GDN ops (their references) where their documented
    # dtypes and shapes bind, plain emulation the plugin's own: both keep bf16 states and
    # round them at different places; the same tokens, logprobs within that rounding.
    assert on["tokens"] == off["tokens"]
    assert max(abs(a - b) for la, lb in zip(on["logprobs"], off["logprobs"])
               for a, b in zip(la, lb)) < BF16_STATE_TOL
    found = set()
    if "documentation gaps" in contract["summary"]:
        listed = contract["summary"].split("documentation gaps")[1].split(": ", 1)[1]
        found = {part.split("=")[0] for part in listed.split(", ")}
    assert {g for g in found if "norm" in g or "rope" in g} == gaps


def test_tiny_dsa_w8a8_pretending_950_takes_the_routes_its_documentation_allows():
    """On an Ascend 950 the int8 linear and expert weights stay ND (FRACTAL_NZ is documented
    for A2/A3; the prolog's own weights are NZ as its docs ask), so the W8A8 experts take
    the unfused sequence (npu_grouped_matmul_swiglu_quant reads its weight
    as NZ and is documented for A2/A3), the MLPs npu_swiglu (npu_dequant_swiglu_quant is
    documented for A2/A3); the dense layer's norm + quant op is a gap there."""
    on = run_script("run_dsa.py", *DSA_ARGS, "--quantized", emulate=True,
                    ASCEND_EXT_NPU_CONTRACT="1", ASCEND_EXT_SOC="ascend950")
    contract = on["contract"]
    assert contract["violations"] == 0, contract["summary"]
    calls = set(contract["calls"])
    assert not {"npu_grouped_matmul_swiglu_quant", "npu_dequant_swiglu_quant"} & calls
    assert {"npu_add_rms_norm_dynamic_quant", "npu_swiglu", "npu_dynamic_quant"} <= calls
    listed = contract["summary"].split("documentation gaps")[1].split(": ", 1)[1]
    assert "npu_add_rms_norm_dynamic_quant@A5" in {p.split("=")[0] for p in listed.split(", ")}
