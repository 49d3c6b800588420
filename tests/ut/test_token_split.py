"""Which MoE blocks run sequence-parallel (moe/token_split.py), and the start-up refusal of
a forced token exchange over replicated TP tokens (platform/config_hooks.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_ascend_ext.moe.alltoall import AllToAllRefused
from vllm_ascend_ext.moe.mc2 import Mc2Refused
from vllm_ascend_ext.moe.token_split import (
    replicated_hint,
    sequence_parallel_moe,
    splits_without_dp,
)
from vllm_ascend_ext.platform.config_hooks import dispatch_gate_facts, refuse_forced_dispatch
from vllm_ascend_ext.platform.facts import ModelFacts, serves_own_moe_block


def _par(tp=2, dp=1, ep=True, pcp=1, vllm_sp=False):
    return SimpleNamespace(tensor_parallel_size=tp, data_parallel_size=dp,
                           enable_expert_parallel=ep, prefill_context_parallel_size=pcp,
                           use_sequence_parallel_moe=vllm_sp)


@pytest.mark.parametrize("setting", ["mc2", "alltoall"])
def test_tp_ep_without_dp_splits_only_when_an_exchange_is_asked_for(setting):
    assert splits_without_dp(_par(), setting)
    for other in ("auto", "allgather"):
        assert not splits_without_dp(_par(), other)
    # each condition on its own rules it out
    for par in (_par(tp=1), _par(dp=2), _par(ep=False), _par(pcp=2)):
        assert not splits_without_dp(par, setting), par


def test_only_the_plugins_own_block_adds_the_split_to_vllms_rule():
    assert sequence_parallel_moe(_par(), "mc2", own_block=True)
    assert not sequence_parallel_moe(_par(), "mc2", own_block=False)
    assert not sequence_parallel_moe(_par(), "auto", own_block=True)
    # vLLM's own rule (DP x TP with EP) holds for every block, whatever the setting
    vllm_sp = _par(dp=2, vllm_sp=True)
    assert sequence_parallel_moe(vllm_sp, "auto", own_block=False)
    assert sequence_parallel_moe(vllm_sp, "allgather", own_block=True)


def test_the_hint_says_vllms_blocks_hold_the_same_tokens_without_data_parallelism():
    assert "every TP rank holds the same tokens" in replicated_hint(_par(), "alltoall",
                                                                    own_block=False)
    assert replicated_hint(_par(), "alltoall", own_block=True) == ""
    assert replicated_hint(_par(dp=2), "alltoall", own_block=False) == ""


def _vllm_config(setting: str, hidden: int = 1024, dtype=torch.bfloat16, **par):
    text = SimpleNamespace(hidden_size=hidden, n_routed_experts=16, num_experts_per_tok=8)
    return SimpleNamespace(
        additional_config={"ascend_ext": {"moe_dispatch": setting}},
        parallel_config=_par(**par),
        model_config=SimpleNamespace(hf_text_config=text, hf_config=text, dtype=dtype),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=256))


OWN, VLLMS = ModelFacts(present=True, own_moe_block=True), ModelFacts(present=True)


@pytest.mark.parametrize("setting,refused", [("alltoall", AllToAllRefused), ("mc2", Mc2Refused)])
def test_a_forced_exchange_under_tp_ep_without_dp_starts_only_for_the_plugins_block(
        setting, refused):
    """TP2 + EP2, DP 1, A3 widths MC2 takes (hidden 1024, bf16): the plugin's block splits
    the tokens and starts; vLLM's block keeps them replicated and is refused, naming why
    and what would split them."""
    refuse_forced_dispatch(_vllm_config(setting), "A3", OWN)
    with pytest.raises(refused, match=r"cannot run here: .*MoE blocks are vLLM's: without "
                                      r"data parallelism every TP rank holds the same tokens"):
        refuse_forced_dispatch(_vllm_config(setting), "A3", VLLMS)
    # the plugin's block without expert parallelism: no exchange to take, still refused
    with pytest.raises(refused, match="no expert-parallel token exchange"):
        refuse_forced_dispatch(_vllm_config(setting, ep=False), "A3", OWN)


def test_the_split_sizes_mc2s_buffers_for_each_tp_ranks_share():
    """256 tokens over TP2: 128 per rank for the plugin's block, the whole 256 replicated
    on each rank for vLLM's; MC2's other bounds still apply to the split layout (A3
    documents hidden >= 1024)."""
    own = dispatch_gate_facts(_vllm_config("mc2"), "A3", True, 16)
    assert (own.capacity, own.exchange, own.replicated, own.ep_world_size) == (128, True, False, 2)
    vllms = dispatch_gate_facts(_vllm_config("mc2"), "A3", False, 16)
    assert (vllms.capacity, vllms.exchange, vllms.replicated) == (256, False, True)
    with pytest.raises(Mc2Refused, match="hidden"):
        refuse_forced_dispatch(_vllm_config("mc2", hidden=512), "A3", OWN)


def test_the_plugins_block_serves_the_dsa_architectures_only():
    for arch in ("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM"):
        assert serves_own_moe_block(SimpleNamespace(architectures=[arch]))
    for archs in (["Qwen3MoeForCausalLM"], ["Qwen2MoeForCausalLM"], None):
        assert not serves_own_moe_block(SimpleNamespace(architectures=archs))
