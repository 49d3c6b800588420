"""The plugin inside real vLLM (emulated) against vLLM's own CPU backend.

Same embedded model, realistic-scale weights, fp32, greedy: tokens must match and
logprobs agree within 1e-4; a corrupted block table (negative control) must not.
Chunked prefill with a small token budget puts prefill chunks beside decodes.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import max_logprob_gap, run_script
from vllm_ascend_ext.platform.probe import npu_present

pytestmark = pytest.mark.e2e

# Eager: these tests are not about compilation (tests/e2e/test_engine_path.py captures graphs).
CHUNKED = ("--max-num-batched-tokens", "16", "--enforce-eager")


@pytest.mark.skipif(npu_present(), reason="on an Ascend host the installed plugin is active "
                    "without emulation: inactivity is checked on hosts without an NPU")
def test_inactive_plugin_leaves_vllm_alone(runs):
    stock = runs(*CHUNKED, emulate=False)
    assert stock["platform"] == "CpuPlatform"
    assert stock["backends"] == ["CPU_ATTN"]
    assert stock["registered"] is False  # no ASCEND_EXT_FIA member was added


def test_emulated_platform_serves_every_layer_with_the_plugin_backend(runs):
    emu = runs(*CHUNKED, emulate=True)
    assert emu["platform"] == "EmulatedAscendPlatform"
    assert emu["backends"] == ["ASCEND_EXT_FIA"]
    assert emu["num_attention_layers"] == 2
    # the NPU platform's choices, not vLLM's CPU platform's (which turns async off)
    assert emu["engine"]["async_scheduling"] is True and emu["engine"]["block_size"] == 128


def test_tokens_and_logprobs_match_vllm_cpu_backend(runs):
    stock, emu = runs(*CHUNKED, emulate=False), runs(*CHUNKED, emulate=True)
    assert stock["engine"]["async_scheduling"] is False   # vLLM's CPU platform's choice
    assert emu["tokens"] == stock["tokens"]
    assert max_logprob_gap(emu, stock) < 1e-4


def test_negative_control_corrupted_block_table_changes_the_result(runs):
    stock = runs(*CHUNKED, emulate=False)
    bad = runs(*CHUNKED, "--corrupt-block-table", emulate=True)
    assert bad["platform"] == "EmulatedAscendPlatform"
    assert bad["tokens"] != stock["tokens"] or max_logprob_gap(bad, stock) > 0.1


def test_bad_plugin_config_fails_before_the_engine_starts():
    res = run_script("check_config_errors.py", emulate=True, timeout=300)
    assert res["platform"] == "EmulatedAscendPlatform"
    *bad, good, llm, fp8, dp_moe, dp_dense, mc2, mc2_auto, a2a_tp, a2a_no_ep, soc = res[
        "results"]
    expected = ["ascend_ext: unknown key 'mixed_splt'; did you mean 'mixed_split'",
                "ascend_ext.mixed_split: invalid value 'false'",
                "ascend_ext.mixed_split: expected a str",
                "ascend_ext.sfa.preprocess: invalid value 'prolog'; did you mean 'prolog_v3'",
                "ascend_ext.sfa: expected an object"]
    # The plugin's own error, first and whole: not wrapped into pydantic's ValidationError.
    for r, start in zip(bad, expected):
        assert r["type"] == "AscendExtConfigError" and r["message"].startswith(start), r
        assert "\n" not in r["message"], r
    assert good == {"ok": True}
    assert llm["type"] == "AscendExtConfigError", llm
    assert llm["message"] == ("ascend_ext.mixed_split: invalid value 'yes' "
                              "(allowed: 'auto', 'on', 'off')")
    assert fp8["type"] == "UnsupportedAttentionError", fp8
    assert "kv_cache_dtype not supported" in fp8["message"]
    assert dp_moe == {"ok": True}, dp_moe         # MoE tokens cross the DP ranks' communicator
    assert dp_dense == {"ok": True}, dp_dense
    # MC2 forced on an A2 node with 2 EP ranks and fp32: refused, naming each (the 2048-token
    # budget is not a reason: larger steps than MC2's 256 per rank take the all-gather)
    assert mc2["type"] == "Mc2Refused", mc2
    for why in ("moe_dispatch is 'mc2' but MC2 cannot run here", "float32",
                "ep_world_size 2 not in (16, 32, 64) on A2"):
        assert why in mc2["message"], (why, mc2)
    assert mc2_auto == {"ok": True}, mc2_auto     # auto: vLLM's all-gather exchange
    # TP2 + EP2 without DP, Qwen MoE: its layers split the tokens over TP, it starts;
    # TP2 without expert parallelism: refused by name
    assert a2a_tp == {"ok": True}, a2a_tp
    assert a2a_no_ep["type"] == "AllToAllRefused", a2a_no_ep
    for why in ("moe_dispatch is 'alltoall' but all-to-all cannot run here",
                "no expert-parallel token exchange"):
        assert why in a2a_no_ep["message"], (why, a2a_no_ep)
    assert soc["type"] == "AscendExtError", soc
    assert soc["message"].startswith("ASCEND_EXT_SOC='ascend999': unknown Ascend SoC 'ascend999'")
