"""Which MoE layers take only their TP rank's share of the tokens (moe/token_split.py), and
the start-up gate of a forced token exchange under TP (platform/config_hooks.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_ascend_ext.moe.alltoall import AllToAllRefused
from vllm_ascend_ext.moe.mc2 import Mc2Refused
from vllm_ascend_ext.moe.token_split import sequence_parallel_moe, splits_without_dp
from vllm_ascend_ext.platform.config_hooks import dispatch_gate_facts, refuse_forced_dispatch


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


def test_an_exchange_asked_for_adds_the_split_to_vllms_rule():
    assert sequence_parallel_moe(_par(), "mc2")
    assert sequence_parallel_moe(_par(), "alltoall")
    assert not sequence_parallel_moe(_par(), "auto")
    # vLLM's own rule (DP x TP with EP) holds whatever the setting
    vllm_sp = _par(dp=2, vllm_sp=True)
    assert sequence_parallel_moe(vllm_sp, "auto")
    assert sequence_parallel_moe(vllm_sp, "allgather")


def _vllm_config(setting: str, hidden: int = 1024, dtype=torch.bfloat16, **par):
    text = SimpleNamespace(hidden_size=hidden, n_routed_experts=16, num_experts_per_tok=8)
    return SimpleNamespace(
        additional_config={"ascend_ext": {"moe_dispatch": setting}},
        parallel_config=_par(**par),
        model_config=SimpleNamespace(hf_text_config=text, hf_config=text, dtype=dtype),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=256, max_num_seqs=64),
        speculative_config=None, compilation_config=SimpleNamespace(cudagraph_capture_sizes=[]))


@pytest.mark.parametrize("setting,refused", [("alltoall", AllToAllRefused), ("mc2", Mc2Refused)])
def test_a_forced_exchange_under_tp_ep_without_dp_starts_and_without_ep_is_refused(
        setting, refused):
    """TP2 + EP2, DP 1, A3 widths MC2 takes (hidden 1024, bf16): the tokens are split over
    TP (by the plugin's block or inside the layer), so the exchange starts; without expert
    parallelism there is nothing to exchange."""
    refuse_forced_dispatch(_vllm_config(setting), "A3")
    with pytest.raises(refused, match="no expert-parallel token exchange"):
        refuse_forced_dispatch(_vllm_config(setting, ep=False), "A3")


def test_the_split_sizes_mc2s_buffers_for_each_tp_ranks_share():
    """256 tokens over TP2: 128 per rank when an exchange is asked for; the whole 256
    replicated on each rank (and no exchange) under 'auto'; MC2's other bounds still apply
    to the split layout (A3 documents hidden >= 1024)."""
    split = dispatch_gate_facts(_vllm_config("mc2"), "A3", 16)
    assert (split.capacity, split.exchange, split.replicated, split.ep_world_size) == (
        128, True, False, 2)
    assert split.decode_tokens == 32          # 64 decode requests over the two TP ranks
    kept = dispatch_gate_facts(_vllm_config("auto"), "A3", 16)
    assert (kept.capacity, kept.exchange, kept.replicated) == (256, False, True)
    assert kept.decode_tokens == 64
    with pytest.raises(Mc2Refused, match="hidden"):
        refuse_forced_dispatch(_vllm_config("mc2", hidden=512), "A3")
