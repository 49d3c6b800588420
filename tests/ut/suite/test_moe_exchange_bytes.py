"""The MoE exchange byte counts (benchmarks/moe_exchange_bytes.py) against sums done by
hand for a small width."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "moe_exchange_bytes",
    Path(__file__).resolve().parents[3] / "benchmarks" / "moe_exchange_bytes.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench          # its dataclasses look their module up
_spec.loader.exec_module(bench)

SMALL = bench.Widths("small", hidden=4, experts=2, top_k=2, moe_layers=3)


def test_tp16_is_one_ring_all_reduce():
    # 8 tokens x 4 x 2 bytes = 64 bytes; a ring all-reduce over 16 ranks sends 2 * 15/16 of it
    ex = bench.tp16(8, SMALL)
    assert (ex.calls, ex.bytes_sent) == (1, 120.0)


def test_the_all_gather_exchange_counts_its_four_calls():
    """DP2 x TP8 + EP16, sequence parallel: 16 ranks hold 1 token each (8 / TP8)."""
    # all-gather over 16 of 16 rows x (4 hidden + 2 logits) x 2 bytes = 192: in a ring a
    # rank sends 15/16 of it, 180; reduce-scatter over 16 of 16 rows x 4 x 2 = 128: 120; TP8 all-gather of 8 x 4 x 2
    # = 64: 56
    ex = bench.all_gather_ep(8, SMALL)
    assert (ex.calls, ex.bytes_sent, ex.host_reads) == (4, 180 + 120 + 56, 0)
    row = ex.row(8, SMALL)
    assert row["KiB_per_served_token"] == pytest.approx(356 / 16 / 1024)
    assert row["MiB_sent_per_step"] == pytest.approx(3 * 356 / 2**20)


def test_all_to_all_sends_each_remote_row_twice_and_mc2_can_send_it_in_int8():
    # one token per rank (8 / TP8), 2 rows, each remote with probability 15/16: 1.875 rows of
    # 4 x 2 bytes each way; the counts: 2 int64, each to its expert's rank, remote with
    # probability 15/16 = 15 bytes; TP8 all-gather of 8 x 4 x 2 = 64: 56
    assert bench.all_to_all_ep(8, SMALL).bytes_sent == pytest.approx(15 + 2 * 15 + 56)
    assert bench.all_to_all_ep(8, SMALL).host_reads == 1
    # MC2 with int8 dispatch: 1.875 x (4 + 4 scale bytes) out, 1.875 x 8 back
    assert bench.mc2_ep(8, SMALL, int8_dispatch=True).bytes_sent == pytest.approx(
        15 + 15 + 56)


def test_tp_ep_without_dp_splitting_replicated_tokens_buys_no_bytes_but_int8():
    """TP16 + EP16 without DP: 16 tokens held by every rank, 1 per rank once split."""
    # built: vLLM's all-reduce of 16 x 4 x 2 = 128 bytes, 2 * 15/16 of it
    built = {r["layout"]: r for r in bench.table(16) if r["model"] == "Qwen3-30B-A3B"}
    assert built["TP16+EP16 all-reduce"]["calls"] == 1
    assert (bench.tp16(16, SMALL).calls, bench.tp16(16, SMALL).bytes_sent) == (1, 240)
    # split: 1 token x 2 rows per rank, 15/16 remote = 1.875 rows of 8 bytes each way,
    # 2 int64 counts (15 bytes remote), and the all-gather of the 16 slices (128 bytes: 120)
    a2a = bench.all_to_all_ep(16, SMALL, split=bench.RANKS)
    assert (a2a.calls, a2a.host_reads, a2a.built) == (4, 1, True)
    assert a2a.bytes_sent == pytest.approx(15 + 2 * 1.875 * 8 + 120)
    # MC2, int8 out (4 bytes + a 4-byte scale per row), bf16 back, then the all-gather
    mc2 = bench.mc2_ep(16, SMALL, int8_dispatch=True, split=bench.RANKS)
    assert (mc2.calls, mc2.host_reads) == (3, 0)
    assert mc2.bytes_sent == pytest.approx(1.875 * 8 + 1.875 * 8 + 120)
    # at hidden 8 the int8 row (8 + 4 scale bytes) is lighter than the bf16 one (16)
    wide = bench.Widths("wide", hidden=8, experts=2, top_k=2, moe_layers=1)
    assert bench.mc2_ep(16, wide, int8_dispatch=True, split=bench.RANKS).bytes_sent == pytest.approx(
        1.875 * 12 + 1.875 * 16 + 15 / 16 * 16 * 8 * 2)


def test_a_split_layer_of_vllms_block_adds_its_shared_experts_all_reduce():
    """vLLM's block with shared experts (sliced over TP): the layer that splits the tokens
    itself leaves them to vLLM's all-reduce, one call and TP16's bytes more; without
    shared experts (or in the plugin's block) nothing is added."""
    shared = bench.Widths("shared", hidden=4, experts=2, top_k=2, moe_layers=1,
                          shared_all_reduce=True)
    plain = bench.Widths("plain", hidden=4, experts=2, top_k=2, moe_layers=1)
    for make in (lambda w: bench.all_to_all_ep(16, w, split=bench.RANKS),
                 lambda w: bench.mc2_ep(16, w, int8_dispatch=True, split=bench.RANKS)):
        assert make(shared).calls == make(plain).calls + 1
        # the all-reduce of 16 x 4 x 2 bytes: 2 * 15/16 of it
        assert make(shared).bytes_sent == pytest.approx(make(plain).bytes_sent + 240)
    # under DP the sequence-parallel MoE runs the shared experts on the split tokens
    assert bench.all_to_all_ep(16, shared).bytes_sent == bench.all_to_all_ep(16, plain).bytes_sent
    split = ("TP16+EP16 all-to-all of split tokens",
             "TP16+EP16 MC2 of split tokens (int8 dispatch, W8A8)")
    built = {(r["model"], r["layout"]): r["built"] for r in bench.table(16)}
    for model in ("DeepSeek-V3.2", "Qwen3-30B-A3B", "Qwen3-Next-80B-A3B"):
        assert [built[model, s] for s in split] == [True, True]


def test_at_deepseek_width_the_split_all_to_all_moves_what_the_all_reduce_moves():
    rows = {r["layout"]: r for r in bench.table(256) if r["model"] == "DeepSeek-V3.2"}
    reduce = rows["TP16+EP16 all-reduce"]["MiB_sent_per_layer"]
    # top-k 8 of 16 ranks: 256/16 x 8 x 15/16 = 120 rows of 7168 x 2 bytes each way, out
    # and back together 15/16 of the engine's 256 x 7168 x 2 bytes: as much as each half of
    # the ring all-reduce
    half = 15 / 16 * 256 * 7168 * 2 / 2**20
    assert reduce == pytest.approx(2 * half)
    assert rows["TP16+EP16 all-to-all of split tokens"]["MiB_sent_per_layer"] == pytest.approx(
        2 * half + 256 * 8 * 15 / 16 / 2**20)
    # MC2: the 120 rows go out as 7168 int8 + a 4-byte scale, come back in bf16
    mc2 = 120 * (7168 + 4) + 120 * 7168 * 2 + 15 / 16 * 256 * 7168 * 2
    assert rows["TP16+EP16 MC2 of split tokens (int8 dispatch, W8A8)"]["vs_TP16"] == pytest.approx(
        mc2 / (2 * half * 2**20))
