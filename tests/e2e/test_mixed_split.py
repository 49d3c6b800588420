"""Mixed chunked-prefill steps split into a decode and a prefill FIA call, end to end.

Emulated engine, embedded model (realistic weights), fp32, torch.compile on (vLLM's CPU
default), 32 concurrent prompts of varied length and a 64-token budget so that most
steps mix decodes with a prefill chunk.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import max_logprob_gap

pytestmark = pytest.mark.e2e

MIXED = ("--many", "--max-num-batched-tokens", "64", "--enforce-eager")   # not about compilation


def _stats(run):
    (st,) = run["split_stats"]
    return st


@pytest.mark.parametrize("extra", [(), ("--ngram",)], ids=["plain", "ngram-spec3"])
def test_split_on_equals_off_and_counters_show_splits(runs, extra):
    on = runs(*MIXED, *extra, "--mixed-split", "on", emulate=True)
    off = runs(*MIXED, *extra, "--mixed-split", "off", emulate=True)
    assert on["tokens"] == off["tokens"]
    assert max_logprob_gap(on, off) < 1e-4
    assert _stats(on)["mixed"] > 10 and _stats(on)["split"] == _stats(on)["mixed"]
    assert _stats(off)["split"] == 0
    assert _stats(off)["declined"] == {"mixed_split=off": _stats(off)["mixed"]}


def test_negative_control_changes_the_split_result(runs):
    on = runs(*MIXED, "--mixed-split", "on", emulate=True)
    bad = runs(*MIXED, "--mixed-split", "on", "--corrupt-block-table", emulate=True)
    assert _stats(bad)["split"] > 0
    assert bad["tokens"] != on["tokens"] or max_logprob_gap(bad, on) > 0.1


def test_auto_declines_on_a2_and_splits_on_950(runs):
    a2 = runs(*MIXED, "--mixed-split", "auto", emulate=True)
    assert _stats(a2)["split"] == 0
    assert _stats(a2)["declined"] == {"soc A2 not in A5": _stats(a2)["mixed"]}
    a5 = runs(*MIXED, "--mixed-split", "auto", emulate=True, ASCEND_EXT_SOC="ascend950")
    assert _stats(a5)["split"] == _stats(a5)["mixed"] > 10
    assert a5["tokens"] == a2["tokens"] and max_logprob_gap(a5, a2) < 1e-4


def test_full_attention_layers_of_a_hybrid_model_reach_the_split():
    from tests.e2e.conftest import run_script

    res = run_script("run_hybrid.py", emulate=True)
    ours = [b for b in res["builders"] if b["builder"] == "AscendFIAMetadataBuilder"]
    others = [b for b in res["builders"] if b["builder"] != "AscendFIAMetadataBuilder"]
    assert len(ours) == 1 and ours[0]["layers"] == ["model.layers.3.self_attn.attn"]
    assert ours[0]["mixed"] > 0 and ours[0]["split"] == ours[0]["mixed"]
    # the three linear-attention layers (bf16 here) on the plugin's own GDN builder
    assert sorted(la for b in others for la in b["layers"]) == [
        f"model.layers.{i}.linear_attn" for i in range(3)]
    assert all(b["builder"] == "AscendGdnMetadataBuilder" for b in others)
    # Every layer's MoE runs through the plugin's MoE method (softmax top-k routing).
    assert res["moe_methods"] == ["AscendFusedMoEMethod"] and res["moe_layers"] == 4
