"""Hybrid models against independent references (``hybrid_compare.py``): the plugin's
emulated engine vs a float64 model written from the checkpoint (``dense_qwen3_next.py``)
and Hugging Face transformers (float64 and the run's dtype), token by token over 16
greedy tokens of prompts of 30-300+ tokens, and layer by layer.

- the embedded tiny Qwen3-Next and a second configuration (other widths, head counts,
  8 experts, dense MLP layers, longer prompts), float32: every token equal and every
  logprob within 1e-4 of every reference, except after routing ties (reported, bounded);
- bfloat16: the logprob error distribution within twice transformers-bf16's (median and
  90th percentile) on the routed model; with every expert taken (a continuous model),
  also every position whose float64 margin exceeds twice transformers-bf16's largest
  error carries float64's token;
- tied word embeddings (vLLM's Qwen3-Next ignores them; the plugin's model class ties);
- negative controls: reversed conv taps (what vLLM's CPU repacking of bf16 conv weights
  did to the plugin's GDN layers) fail the comparison, and layer mode names the first
  GDN layer's token mixer at position 0; a mis-scaled attention is named at the
  full-attention layer; in bf16, reversed conv taps fail the routed model's rule.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import run_script

pytestmark = pytest.mark.e2e

SECOND = {"hidden_size": 256, "num_hidden_layers": 8, "num_attention_heads": 8,
          "num_key_value_heads": 2, "head_dim": 128, "linear_num_key_heads": 4,
          "linear_num_value_heads": 8, "linear_key_head_dim": 128,
          "linear_value_head_dim": 128, "num_experts": 8, "num_experts_per_tok": 2,
          "moe_intermediate_size": 64, "shared_expert_intermediate_size": 128,
          "mlp_only_layers": [2]}
ALL_EXPERTS = {"num_experts_per_tok": 4}   # the embedded model's 4 experts, all taken
MAX_EXCUSED = 0.25   # routing ties may excuse at most this share of the positions


def compare(*args: str) -> dict:
    return run_script("hybrid_compare.py", "--json", *args, emulate=True, timeout=900)


@pytest.fixture(scope="module")
def embedded_fp32():
    return compare("--prompts", "8", "--layers", "0")


def _assert_passes(res: dict) -> None:
    assert res["failures"] == [], res["failures"]
    assert res["excused_fraction"] <= MAX_EXCUSED, res["excused_fraction"]
    # the comparison is not vacuous: 16 tokens per prompt were compared to three references
    assert all(len(e["tokens"]) == 16 and {"dense_float64", "hf_float64", "hf_float32"} <= set(e)
               for e in res["prompts"])


def test_embedded_model_float32_matches_every_reference(embedded_fp32):
    res = embedded_fp32
    assert len(res["prompts"]) == 8
    assert min(e["len"] for e in res["prompts"]) == 30 and max(e["len"] for e in res["prompts"]) == 300
    _assert_passes(res)


def test_layer_mode_finds_no_departure_on_the_embedded_model(embedded_fp32):
    lay = embedded_fp32["layers"]
    assert lay["missing_rows"] == 0       # every position's every part was recorded
    assert lay["first"] is None, lay["first"]
    assert not [f for f in lay["routing"]["flips"] if not f["tie"]], lay["routing"]
    # every layer part was compared over the prompt and the 15 decode positions
    assert len(lay["table"]) == 4 * 3 and all(r["max_err"] < 1e-3 for r in lay["table"])


def test_second_configuration_float32_longer_prompts():
    # Compiled (torch.compile, as served): the hybrid model's one compiled run; the others
    # run eager (they are not about compilation).
    res = compare("--variant", json.dumps(SECOND), "--prompts", "10", "--max-len", "500",
                  "--prompt-kind", "text")
    assert max(e["len"] for e in res["prompts"]) > 300
    _assert_passes(res)


def test_bfloat16_error_distribution_matches_transformers_bf16_with_routing():
    # top-2 of 4 experts: flips at bf16 routing near-ties differ between two correct bf16
    # implementations, so the error distribution is judged, not single positions
    res = compare("--dtype", "bfloat16", "--prompts", "8", "--eager")
    assert res["routed"] and res["failures"] == [], res["failures"]


def test_bfloat16_matches_float64_where_margins_exceed_bf16_error():
    # every expert taken: the model is continuous, and every position whose float64 margin
    # exceeds twice transformers-bf16's largest error must carry float64's token
    res = compare("--dtype", "bfloat16", "--prompts", "8", "--variant", json.dumps(ALL_EXPERTS), "--eager")
    assert not res["routed"] and res["failures"] == [], res["failures"]
    assert res["bf16_counted"] >= 0.3, res["bf16_counted"]   # not vacuous


def test_bfloat16_negative_control_reversed_conv_taps_on_the_routed_model():
    # the rule the routed model is judged by (the error distribution) must catch it
    res = compare("--dtype", "bfloat16", "--prompts", "8", "--corrupt", "conv-taps", "--eager")
    assert res["routed"] and any("median" in f for f in res["failures"]), res["failures"]


def test_tied_word_embeddings_are_tied():
    # every expert taken (no routing ties to excuse): the comparison covers every position
    tied = {**SECOND, "num_hidden_layers": 4, "tie_word_embeddings": True,
            "num_experts_per_tok": SECOND["num_experts"]}
    res = compare("--variant", json.dumps(tied), "--prompts", "3", "--no-hf", "--eager")
    assert res["failures"] == [], res["failures"]
    assert res["excused_fraction"] == 0 and all(len(e["tokens"]) == 16 for e in res["prompts"])


def test_blocks_above_fias_limit_are_served_through_smaller_kernel_blocks():
    # FIA's paged TND takes blocks up to 512; a 1024-token scheduler block (what hybrid
    # models get when their attention page is aligned to a large mamba page) is split into
    # 512-token kernel blocks, and prompts crossing them still match the float64 model
    # (vLLM's CPU runner zeroed new blocks by scheduler id in the kernel-block view: another
    # request's keys; the NPU runner, which emulation runs, zeroes every kernel block)
    res = compare("--block-size", "1024", "--lengths", "700,530,90", "--no-hf", "--eager")
    assert res["attention_kernel_block"] == 512 and res["runner"] == "EmulatedNPUModelRunner"
    assert res["failures"] == [], res["failures"]
    assert all(len(e["tokens"]) == 16 for e in res["prompts"])


def test_negative_control_reversed_conv_taps_are_named_in_the_first_gdn_layer():
    res = compare("--corrupt", "conv-taps", "--prompts", "3", "--layers", "0")
    assert res["failures"]
    first = res["layers"]["first"]
    assert first["part"] == "L0.mixer" and first["position"] == 0, first


def test_negative_control_a_broken_slot_mapping_substitute_fails_the_comparison():
    # the emulated engine computes its slots with the NPU platform's substitute of vLLM's
    # Triton kernel (worker/kernel_substitutes.py): shifting them must show
    res = compare("--corrupt", "slot-mapping", "--prompts", "3", "--no-hf", "--eager")
    assert any("logprob gap" in f for f in res["failures"]), res["failures"]


def test_negative_control_misscaled_attention_is_named_in_the_attention_layer():
    res = compare("--corrupt", "attn-scale", "--prompts", "3", "--layers", "0")
    assert res["failures"]
    # position 0 attends to itself only, so the scale first shows at position 1
    assert res["layers"]["first"]["part"] == "L3.mixer", res["layers"]["first"]
