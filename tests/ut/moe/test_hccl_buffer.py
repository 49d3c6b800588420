"""The HCCL buffer an MC2 group needs (``moe/hccl_buffer.py``), each formula worked out by
hand from the dispatch documentation, and the start-up check on a real vLLM config with
Qwen3-30B-A3B's sizes: logged, refused naming HCCL_BUFFSIZE and the number, sized from
``max_num_seqs x (1 + k)``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from vllm_ascend_ext.errors import AscendExtError
from vllm_ascend_ext.moe.hccl_buffer import check_buffer, configured_mb, required_buffer
from vllm_ascend_ext.moe.mc2 import Mc2Facts, buffer_tokens

MODELS = Path(__file__).resolve().parents[3] / "vllm_ascend_ext" / "models"


def test_a3_formula_by_hand_deepseek_ep32():
    # EP 32, 256 experts (8 per rank), H 7168, top-8, 512 tokens per rank:
    # Align32(2 * 7168) = 14336; + 64 = 14400; Align512 -> 14848
    # rows   = 8 * 512 * 32 * 14848          = 1_946_157_056
    # shared = (8 + 1) * 512 * Align512(14336) = 9 * 512 * 14336 = 66_060_288
    # need   = 2 * (rows + shared)          = 4_024_434_688 bytes = 3838 MB (3.75 GiB)
    need = required_buffer("A3", hidden=7168, top_k=8, experts=256, ep_world=32, max_bs=512)
    assert (need.nbytes, need.megabytes, need.algorithm) == (4_024_434_688, 3838, "fullmesh_v1")
    # sized for a decode step of 64 requests instead: 8 times fewer rows
    small = required_buffer("A3", hidden=7168, top_k=8, experts=256, ep_world=32, max_bs=64)
    assert small.nbytes == 2 * (8 * 64 * 32 * 14848 + 9 * 64 * 14336) == 503_054_336


def test_a2_formulas_by_hand_fullmesh_and_hierarchy():
    # fullmesh: 2 * (BS * ep * min(local, K) * H * 2 + 2 MB), EP 16, 64 experts (4 per rank)
    # = 2 * (256 * 16 * 4 * 7168 * 2 + 2_097_152) = 2 * 236_978_176 = 473_956_352 -> 452 MB
    full = required_buffer("A2", hidden=7168, top_k=8, experts=64, ep_world=16, max_bs=256)
    assert (full.nbytes, full.megabytes, full.algorithm) == (473_956_352, 452, "fullmesh")
    # hierarchy: E * BS * (H * 2 + 4 * Align8(K) * 4) + 4 MB + 100 MB
    # = 64 * 256 * (14336 + 128) + 109_051_904 = 236_978_176 + 109_051_904 -> 330 MB
    env = {"HCCL_INTRA_PCIE_ENABLE": "1", "HCCL_INTRA_ROCE_ENABLE": "0"}
    hier = required_buffer("A2", hidden=7168, top_k=8, experts=64, ep_world=16, max_bs=256,
                           environ=env)
    assert (hier.nbytes, hier.megabytes, hier.algorithm) == (346_030_080, 330, "hierarchy")
    with pytest.raises(ValueError, match="A2 and A3, not A5"):
        required_buffer("A5", hidden=7168, top_k=8, experts=64, ep_world=16, max_bs=256)


def test_the_check_names_the_variable_and_the_number():
    need = required_buffer("A3", hidden=7168, top_k=8, experts=256, ep_world=32, max_bs=512)
    with pytest.raises(AscendExtError, match=r"HCCL_BUFFSIZE >= 3838 MB .* is 200 MB \(the "
                                             r"default\).*Set HCCL_BUFFSIZE=3838"):
        check_buffer(need, {}, "EP 32")
    with pytest.raises(AscendExtError, match="is 3837 MB;"):
        check_buffer(need, {"HCCL_BUFFSIZE": "3837"}, "EP 32")
    check_buffer(need, {"HCCL_BUFFSIZE": "3838"}, "EP 32")
    assert configured_mb({}) == 200
    for bad in ("2G", "0"):
        with pytest.raises(AscendExtError, match="HCCL_BUFFSIZE"):
            configured_mb({"HCCL_BUFFSIZE": bad})


def test_buffers_are_sized_for_a_decode_step():
    facts = dict(setting="auto", family="A3", exchange=True, linear=True,
                 dtype=torch.bfloat16, hidden=2048, top_k=8, experts=128, ep_world_size=16,
                 ep_rank=0, capacity=2048)
    assert buffer_tokens(Mc2Facts(**facts)) == 512                     # the SoC's bound
    assert buffer_tokens(Mc2Facts(**facts, decode_tokens=64 * 2)) == 128
    assert buffer_tokens(Mc2Facts(**{**facts, "capacity": 100}, decode_tokens=128)) == 100


def _qwen3_30b(tmp_path, max_num_seqs: int, spec_tokens: int = 0):
    """A real vLLM config of Qwen3-30B-A3B's MoE sizes at DP 16 + EP 16, bf16."""
    from vllm.config import ModelConfig, ParallelConfig, VllmConfig

    config = json.loads((MODELS / "tiny_qwen_moe" / "config.json").read_text())
    config.update(hidden_size=2048, num_experts=128, num_experts_per_tok=8,
                  num_attention_heads=32, num_key_value_heads=4, head_dim=128)
    (tmp_path / "config.json").write_text(json.dumps(config))
    vllm_config = VllmConfig(
        model_config=ModelConfig(model=str(tmp_path), dtype=torch.bfloat16,
                                 skip_tokenizer_init=True),
        parallel_config=ParallelConfig(data_parallel_size=16, enable_expert_parallel=True))
    vllm_config.scheduler_config.max_num_seqs = max_num_seqs
    if spec_tokens:  # what the decode-step size reads of a speculative config
        vllm_config.speculative_config = type("Spec", (), {
            "num_speculative_tokens": spec_tokens})()
    return vllm_config


def test_start_up_refuses_a_small_buffer_for_forced_mc2(tmp_path):
    from vllm_ascend_ext.platform.config_hooks import check_mc2_buffer

    # 256 requests per rank: 8 local experts * 256 * 16 * Align512(4096 + 64 = 4160) = 4608
    # rows 150_994_944; shared (8 + 1) * 256 * 4096 = 9_437_184; x2 = 320_864_256 -> 306 MB
    forced = _qwen3_30b(tmp_path, 256)
    forced.additional_config = {"ascend_ext": {"moe_dispatch": "mc2"}}
    with pytest.raises(AscendExtError, match=r"HCCL_BUFFSIZE >= 306 MB"):
        check_mc2_buffer(forced, "A3", {})
    assert check_mc2_buffer(forced, "A3", {"HCCL_BUFFSIZE": "306"}).megabytes == 306
    # auto: no refusal (the layers size their buffers for what HCCL_BUFFSIZE holds)
    assert check_mc2_buffer(_qwen3_30b(tmp_path, 256), "A3", {}).megabytes == 306
    # 64 requests with MTP k = 1: 128 tokens per rank, half the 256-token need -> 153 MB
    need = check_mc2_buffer(_qwen3_30b(tmp_path, 64, spec_tokens=1), "A3", {})
    assert need.nbytes == 2 * (8 * 128 * 16 * 4608 + 9 * 128 * 4096) and need.megabytes == 153
    # no MC2 where the gate declines it (A2 takes EP 16/32/64 and at most 24 local experts:
    # 128 / 16 = 8 passes; the all-gather setting never runs MC2)
    config = _qwen3_30b(tmp_path, 256)
    config.additional_config = {"ascend_ext": {"moe_dispatch": "allgather"}}
    assert check_mc2_buffer(config, "A3", {}) is None


def test_the_buffers_shrink_to_what_hccl_buffsize_holds_under_auto():
    from dataclasses import replace

    from vllm_ascend_ext.moe.hccl_buffer import tokens_that_fit
    from vllm_ascend_ext.moe.mc2 import declined, with_hccl_limit

    sizes = dict(hidden=2048, top_k=8, experts=128, ep_world=16)
    # 200 MB: the largest t with 2 * (8*t*16*4608 + 9*t*4096) = 1_253_376 * t <= 200 MiB
    assert tokens_that_fit("A3", **sizes, upto=512, environ={}) == 167
    assert 1_253_376 * 167 <= 200 * 2**20 < 1_253_376 * 168
    assert tokens_that_fit("A3", **sizes, upto=100, environ={}) == 100
    assert tokens_that_fit("A3", **sizes, upto=512, environ={"HCCL_BUFFSIZE": "1"}) == 0
    facts = Mc2Facts(setting="auto", family="A3", exchange=True, linear=True,
                     dtype=torch.bfloat16, hidden=2048, top_k=8, experts=128,
                     ep_world_size=16, ep_rank=0, capacity=2048, decode_tokens=256)
    assert buffer_tokens(with_hccl_limit(facts, {})) == 167
    assert buffer_tokens(with_hccl_limit(facts, {"HCCL_BUFFSIZE": "400"})) == 256
    off = with_hccl_limit(facts, {"HCCL_BUFFSIZE": "1"})
    assert any("HCCL_BUFFSIZE" in why for why in declined(off))
    # "mc2" keeps the decode step's size (start-up refuses a small buffer instead)
    assert buffer_tokens(with_hccl_limit(replace(facts, setting="mc2"), {})) == 256


def test_a_decode_step_is_padded_to_its_graphs_capture_size():
    from types import SimpleNamespace

    from vllm_ascend_ext.moe.mc2 import decode_tokens

    sched = SimpleNamespace(max_num_seqs=100)
    assert decode_tokens(sched, None) == 100
    assert decode_tokens(sched, None, capture_sizes=[1, 2, 4, 8, 96, 104, 112]) == 104
    assert decode_tokens(sched, None, 2, [1, 2, 4, 8, 96, 104, 112]) == 52
    spec = SimpleNamespace(num_speculative_tokens=1)
    assert decode_tokens(sched, spec, capture_sizes=[128, 256]) == 256
    assert decode_tokens(SimpleNamespace(max_num_seqs=300), None, capture_sizes=[8, 256]) == 300
