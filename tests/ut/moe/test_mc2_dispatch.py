"""MC2 (``npu_moe_distribute_dispatch_v2`` / ``combine_v2``) over real gloo groups of 2 and 3
ranks, the emulation's stand-in for HCCL: what each rank receives against the rows computed
here from every rank's known inputs, the dispatch -> experts -> combine round trip and the
plugin's MC2 dispatcher (``moe/mc2.py``) against explicit float64 loops over every expert,
and with W8A8 experts against the layer on one rank; contract mode on the calls (A3: none;
A2, whose documentation lists other EP sizes: a violation); the gate's decisions and the
per-step choice of a step-sized plan (pure)."""

from __future__ import annotations

import functools
import os

import pytest
import torch
import torch.distributed as dist

from tests.ut.conftest import spawn_ranks
from vllm_ascend_ext.moe.mc2 import Mc2Facts, Mc2Refused, declined, mc2_plan
from vllm_ascend_ext.moe.step_route import ALLGATHER, ALLTOALL, LOCAL, MC2, step_route
from vllm_ascend_ext.ops import moe_distribute_bounds as bounds

H, K, E, FFN = 16, 2, 6, 8
BS = [3, 5, 2]               # uneven tokens per rank (DP ranks with different batches)


def _inputs(rank: int, world: int):
    g = torch.Generator().manual_seed(100 + rank)
    bs = BS[rank]
    x = torch.randn(bs, H, generator=g)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(bs)]).to(torch.int32)
    scales = torch.rand(bs, K, generator=g)
    return x, ids, scales


def _weights():
    g = torch.Generator().manual_seed(7)
    return (torch.randn(E, H, 2 * FFN, generator=g) / H ** 0.5,
            torch.randn(E, FFN, H, generator=g) / FFN ** 0.5)


def _int8_weights():
    """W8A8 experts: int8 ``w13``/``w2`` with per-output-channel scales."""
    g = torch.Generator().manual_seed(8)
    return (torch.randint(-127, 128, (E, H, 2 * FFN), generator=g, dtype=torch.int8),
            torch.rand(E, 2 * FFN, generator=g) / 50,
            torch.randint(-127, 128, (E, FFN, H), generator=g, dtype=torch.int8),
            torch.rand(E, H, generator=g) / 50)


def _expert_fn(e: int, rows: torch.Tensor) -> torch.Tensor:
    return rows * (e + 1) + 0.5 * e


def _worker(rank: int, world: int, store: str, queue) -> None:
    from vllm_ascend_ext.contract import mode
    from vllm_ascend_ext.contract.harness import ContractViolation, Harness
    from vllm_ascend_ext.moe import experts
    from vllm_ascend_ext.moe.expert_shard import expert_shard
    from vllm_ascend_ext.moe.mc2 import Mc2Plan, routed_experts_mc2
    from vllm_ascend_ext.ops.counting import OpCounter
    from vllm_ascend_ext.ops.format import ACL_FORMAT_FRACTAL_NZ, npu_format_cast
    from vllm_ascend_ext.ops.moe_distribute import (
        npu_moe_distribute_combine_v2,
        npu_moe_distribute_dispatch_v2,
        register_group,
    )
    from vllm_ascend_ext.platform.soc import from_name

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    register_group("ep", dist.group.WORLD)
    x, ids, scales = _inputs(rank, world)
    local = E // world
    common = dict(group_ep="ep", ep_world_size=world, ep_rank_id=rank, moe_expert_num=E,
                  global_bs=max(BS[:world]) * world)
    out = {}
    rows, _, assist, counts, recv, tp, _ = npu_moe_distribute_dispatch_v2(x, ids, **common)
    out["rows"], out["counts"] = rows, counts
    _, _, _, ends, _, _, _ = npu_moe_distribute_dispatch_v2(x, ids, expert_token_nums_type=0,
                                                            **common)
    out["ends"] = ends
    out["q_rows"], out["q_scales"], *_ = npu_moe_distribute_dispatch_v2(x, ids, quant_mode=2,
                                                                       **common)
    done = rows.clone()
    begin = 0
    for j, n in enumerate(counts.tolist()):
        done[begin:begin + n] = _expert_fn(rank * local + j, rows[begin:begin + n])
        begin += n
    out["combined"] = npu_moe_distribute_combine_v2(done, ids, assist, recv, scales,
                                                    tp_send_counts=tp, **common)
    out["shared"] = npu_moe_distribute_combine_v2(done, ids, assist, recv, scales,
                                                  shared_expert_x=torch.ones(x.shape),
                                                  tp_send_counts=tp, **common)
    w13, w2 = _weights()
    plan = Mc2Plan("ep", world, rank, E, max(BS[:world]) * world)
    mine = slice(rank * local, (rank + 1) * local)
    ffn = functools.partial(experts.grouped_ffn, w13=w13[mine].contiguous(),
                            w2=w2[mine].contiguous())
    with OpCounter() as c:
        out["layer"] = routed_experts_mc2(x, scales, ids, ffn, plan)
    out["mc2_calls"] = dict(c.total())
    # W8A8 experts through MC2 (fused and unfused), against the layer's own route on one
    # rank holding every expert (the same per-row quantization of the same rows)
    q13, s13, q2, s2 = _int8_weights()
    for fused in (False, True):
        ours = [q13[mine].contiguous(), s13[mine], q2[mine].contiguous(), s2[mine]]
        every = [q13, s13, q2, s2]
        if fused:
            ours[0], every[0] = (npu_format_cast(w, ACL_FORMAT_FRACTAL_NZ)
                                 for w in (ours[0], every[0]))
        grouped = experts.grouped_ffn_w8a8_fused if fused else experts.grouped_ffn_w8a8
        one = experts.routed_experts_w8a8_fused if fused else experts.routed_experts_w8a8
        ffn = functools.partial(grouped, **dict(zip(("w13", "w13_scale", "w2", "w2_scale"),
                                                    ours)))
        with OpCounter() as c:
            out[f"w8a8_{fused}"] = routed_experts_mc2(x, scales, ids, ffn, plan, int8_rows=True)
        out[f"w8a8_calls_{fused}"] = dict(c.total())
        out[f"w8a8_one_{fused}"] = one(x, scales, ids, *every)
    emap = torch.full((E,), -1, dtype=torch.int32)
    emap[mine] = torch.arange(local, dtype=torch.int32)
    shard = expert_shard("layer", emap, E, local)      # built at load time, not per step
    ours = w13[mine].contiguous(), w2[mine].contiguous()
    with OpCounter() as c:     # the all-gather route's share of the same layer (before the exchange)
        experts.routed_experts(x, scales, ids, *ours, shard)
    out["allgather_calls"] = sum(c.total().values())
    # contract mode: documented sizes pretending A3, then A2
    wide = x.repeat(1, 1024 // H).to(torch.bfloat16)
    os.environ[mode.ENV] = "1"
    for soc in ("ascend910_9391", "ascend910b2"):
        mode._HARNESS[:] = [Harness(from_name(soc))]
        mode.install()
        try:
            r, _, a, _, rc, t, _ = npu_moe_distribute_dispatch_v2(wide, ids, **common)
            npu_moe_distribute_combine_v2(r, ids, a, rc, scales, tp_send_counts=t, **common)
            out[soc] = "ok"
        except ContractViolation as e:
            out[soc] = str(e)
    del os.environ[mode.ENV]
    queue.put((rank, {k: v.tolist() if isinstance(v, torch.Tensor) else v
                      for k, v in out.items()}))
    dist.destroy_process_group()


@pytest.fixture(scope="module", params=[2, 3])
def ranks(request, tmp_path_factory):
    world = request.param
    store = str(tmp_path_factory.mktemp(f"mc2_{world}") / "store")
    got = spawn_ranks(_worker, world, store)
    return world, got


def _all_inputs(world):
    return [_inputs(r, world) for r in range(world)]


@pytest.mark.xdist_group("mc2")
def test_each_rank_receives_its_experts_rows_grouped_by_expert_then_source(ranks):
    world, got = ranks
    inputs, local = _all_inputs(world), E // world
    for rank in range(world):
        rows = torch.tensor(got[rank]["rows"])
        counts = got[rank]["counts"]
        begin = 0
        for j in range(local):
            e = rank * local + j
            want = [x[(ids == e).any(1)] for x, ids, _ in inputs]   # per source rank
            assert counts[j] == sum(len(w) for w in want)
            for w in want:                      # sources in rank order, as documented
                assert torch.equal(rows[begin:begin + len(w)], w)
                begin += len(w)
        assert got[rank]["ends"] == torch.tensor(counts).cumsum(0).tolist()
        # A = global_bs * min(L, K) rows; those past the received ones are undefined (NaN)
        assert rows.shape[0] == max(BS[:world]) * world * min(local, K)
        assert torch.isnan(rows[begin:]).all()


@pytest.mark.xdist_group("mc2")
def test_quant_mode_2_sends_each_token_as_int8_rows_with_its_per_token_scale(ranks):
    """The dispatch's dynamic quantization: every received row is its source token
    quantized per token and symmetric (computed here: amax / 127, rounded), in the same
    order as the float rows; the scales past the received rows are undefined (NaN)."""
    world, got = ranks
    inputs, local = _all_inputs(world), E // world
    for rank in range(world):
        rows = torch.tensor(got[rank]["q_rows"], dtype=torch.int8)
        scales = torch.tensor(got[rank]["q_scales"])
        begin = 0
        for j in range(local):
            for x, ids, _ in inputs:
                sent = x[(ids == rank * local + j).any(1)]
                scale = sent.abs().amax(1) / 127
                want = torch.round(sent / scale[:, None]).clamp(-128, 127).to(torch.int8)
                assert torch.equal(rows[begin:begin + len(sent)], want)
                torch.testing.assert_close(scales[begin:begin + len(sent)], scale)
                begin += len(sent)
        assert torch.isnan(scales[begin:]).all() and not rows[begin:].any()


@pytest.mark.xdist_group("mc2")
def test_combine_returns_each_tokens_weighted_sum_over_its_experts(ranks):
    world, got = ranks
    for rank, (x, ids, scales) in enumerate(_all_inputs(world)):
        want = torch.zeros(x.shape, dtype=torch.float64)
        for t in range(x.shape[0]):
            for k in range(K):
                e = int(ids[t, k])
                want[t] += float(scales[t, k]) * _expert_fn(e, x[t].double())
        assert torch.allclose(torch.tensor(got[rank]["combined"], dtype=torch.float64), want,
                              atol=1e-5)
        assert torch.allclose(torch.tensor(got[rank]["shared"], dtype=torch.float64), want + 1,
                              atol=1e-5)


@pytest.mark.xdist_group("mc2")
def test_the_mc2_dispatcher_equals_every_expert_computed_in_one_place(ranks):
    world, got = ranks
    w13, w2 = (w.double() for w in _weights())
    for rank, (x, ids, scales) in enumerate(_all_inputs(world)):
        want = torch.zeros(x.shape, dtype=torch.float64)
        for t in range(x.shape[0]):
            for k in range(K):
                e = int(ids[t, k])
                gate, up = (x[t].double() @ w13[e]).chunk(2)
                want[t] += float(scales[t, k]) * ((torch.nn.functional.silu(gate) * up) @ w2[e])
        assert torch.allclose(torch.tensor(got[rank]["layer"], dtype=torch.float64), want,
                              atol=1e-5)


@pytest.mark.xdist_group("mc2")
def test_w8a8_experts_through_mc2_equal_the_layer_on_one_rank(ranks):
    """The dispatch quantizes each token per row before sending it, as the layer's own
    route does on one rank holding every expert: the same values (up to the order of the
    k-sum), fused (NZ ``w13``, ``npu_grouped_matmul_swiglu_quant``) and unfused (the
    SwiGLU output quantized by ``npu_dynamic_quant`` before the second grouped matmul)."""
    world, got = ranks
    for rank in range(world):
        for fused in (False, True):
            ours = torch.tensor(got[rank][f"w8a8_{fused}"])
            one = torch.tensor(got[rank][f"w8a8_one_{fused}"])
            assert one.abs().max() > 0.1                # not a vacuous comparison
            assert torch.allclose(ours, one, atol=1e-5, rtol=1e-5), (rank, fused)
        # the dispatch quantizes the tokens (quant_mode 2): no pass over the whole buffer
        assert got[rank]["w8a8_calls_False"] == {
            "npu_moe_distribute_dispatch_v2": 1, "npu_grouped_matmul": 2, "npu_swiglu": 1,
            "npu_dynamic_quant": 1, "npu_moe_distribute_combine_v2": 1}
        assert got[rank]["w8a8_calls_True"] == {
            "npu_moe_distribute_dispatch_v2": 1, "npu_grouped_matmul_swiglu_quant": 1,
            "npu_grouped_matmul": 1, "npu_moe_distribute_combine_v2": 1}


@pytest.mark.xdist_group("mc2")
def test_the_mc2_route_is_five_device_calls_per_layer_after_routing(ranks):
    """Dispatch, grouped matmul, SwiGLU, grouped matmul, combine: nothing else on the device
    (no permutation, no row clearing), against the all-gather route's 11 for the same
    rank's experts before vLLM's two all-gathers and one reduce-scatter."""
    world, got = ranks
    for rank in range(world):
        assert got[rank]["mc2_calls"] == {"npu_moe_distribute_dispatch_v2": 1,
                                          "npu_grouped_matmul": 2, "npu_swiglu": 1,
                                          "npu_moe_distribute_combine_v2": 1}
        assert got[rank]["allgather_calls"] == 11


@pytest.mark.xdist_group("mc2")
def test_contract_mode_takes_documented_calls_and_names_a2s_ep_sizes(ranks):
    world, got = ranks
    for rank in range(world):
        assert got[rank]["ascend910_9391"] == "ok"
        a2 = got[rank]["ascend910b2"]
        assert "npu_moe_distribute_dispatch_v2" in a2
        assert f"ep_world_size {world} not in (16, 32, 64)" in a2



# -- combine: the k-sum in expert_ids' column order (the owners' golden) ----------------
KO_E, KO_K, KO_BS, KO_H = 6, 3, 4, 8        # 2 ranks: experts 0-2 on rank 0, 3-5 on rank 1


def _k_order_inputs(rank: int):
    """fp16 tokens, fp32 scales. Tokens 0 and 1 have their experts' owners (and, on rank 1,
    the local experts) in the reverse of k order: ids (4, 3, 1) and (5, 2, 0). Column 0 of
    token 0 is built so the fp32 k-sum lands exactly on an fp16 midpoint: k order gives
    (1 + 2^-11) + 2^-24 + 2^-24 = 1 + 2^-11 (each half-ulp add ties to even) -> fp16 1.0;
    the reverse gives 2^-23 + (1 + 2^-11) -> fp16 1 + 2^-10."""
    g = torch.Generator().manual_seed(40 + rank)
    x = torch.randn(KO_BS, KO_H, generator=g).half()
    ids = torch.stack([torch.tensor([4, 3, 1]), torch.tensor([5, 2, 0])]
                      + [torch.randperm(KO_E, generator=g)[:KO_K] for _ in range(KO_BS - 2)])
    scales = torch.rand(KO_BS, KO_K, generator=g)
    x[0, 0] = 2.0 ** -12
    for k, target in enumerate((1 + 2.0 ** -11, 2.0 ** -24, 2.0 ** -24)):
        # expert e multiplies its rows by 2^e: row(0, k)[0] = 2^-12 * 2^e, exact
        scales[0, k] = target / (2.0 ** -12 * 2.0 ** int(ids[0, k]))
    return x, ids.to(torch.int32), scales


def _k_order_expert(e: int, rows: torch.Tensor) -> torch.Tensor:
    return rows * 2.0 ** e                                 # exact in fp16


def _k_order_worker(rank: int, world: int, store: str, queue) -> None:
    from vllm_ascend_ext.ops.moe_distribute import (
        npu_moe_distribute_combine_v2,
        npu_moe_distribute_dispatch_v2,
        register_group,
    )

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    register_group("ep", dist.group.WORLD)
    x, ids, scales = _k_order_inputs(rank)
    local = KO_E // world
    common = dict(group_ep="ep", ep_world_size=world, ep_rank_id=rank, moe_expert_num=KO_E,
                  global_bs=KO_BS * world)
    rows, _, assist, counts, recv, tp, _ = npu_moe_distribute_dispatch_v2(x, ids, **common)
    done = rows.clone()
    begin = 0
    for j, n in enumerate(counts.tolist()):
        done[begin:begin + n] = _k_order_expert(rank * local + j, rows[begin:begin + n])
        begin += n
    out = {"combined": npu_moe_distribute_combine_v2(done, ids, assist, recv, scales,
                                                     tp_send_counts=tp, **common),
           "shared": npu_moe_distribute_combine_v2(done, ids, assist, recv, scales,
                                                   shared_expert_x=x.flip(0),
                                                   tp_send_counts=tp, **common)}
    queue.put((rank, {k: (str(v.dtype), v.float().tolist()) for k, v in out.items()}))
    dist.destroy_process_group()


@pytest.mark.xdist_group("mc2")
def test_combine_sums_each_tokens_experts_in_k_order_in_float32_rounding_once(tmp_path):
    """The owners' CPU golden (op-plugin ``test_moe_distribute_combine_v2.py``): each row
    in float32 times its scale, summed over k = 0..K-1, plus the shared expert, rounded once
    to fp16; not in the order the rows come back from their owners."""
    world = 2
    got = spawn_ranks(_k_order_worker, world, str(tmp_path / "store"))
    for rank in range(world):
        x, ids, scales = _k_order_inputs(rank)
        want = torch.empty(KO_BS, KO_H, dtype=torch.float16)
        with_shared = torch.empty(KO_BS, KO_H, dtype=torch.float16)
        for t in range(KO_BS):
            acc = torch.zeros(KO_H, dtype=torch.float32)
            for k in range(KO_K):
                row = _k_order_expert(int(ids[t, k]), x[t])             # fp16, exact
                acc = acc + row.float() * scales[t, k]
            want[t] = acc.half()
            with_shared[t] = (acc + x.flip(0)[t].float()).half()
        for key, expect in (("combined", want), ("shared", with_shared)):
            dtype, values = got[rank][key]
            assert dtype == "torch.float16"
            assert torch.equal(torch.tensor(values).half(), expect), (rank, key)
        # the hand-built column: k order gives 1.0, the owners' order 1 + 2^-10
        assert float(want[0, 0]) == 1.0
        reverse = torch.zeros((), dtype=torch.float32)
        for k in reversed(range(KO_K)):
            reverse = reverse + _k_order_expert(int(ids[0, k]), x[0, :1]).float()[0] * scales[0, k]
        assert float(reverse.half()) == 1.0 + 2.0 ** -10


# -- the gate (pure) ---------------------------------------------------------------------
def _facts(**kw) -> Mc2Facts:
    base = dict(setting="auto", family="A3", exchange=True, linear=True,
                dtype=torch.bfloat16, hidden=7168, top_k=8, experts=256, ep_world_size=16,
                ep_rank=3, capacity=256)
    return Mc2Facts(**{**base, **kw})


def test_the_gate_takes_mc2_for_deepseek_widths_on_a3_and_says_why_not_elsewhere():
    assert declined(_facts()) == []
    plan = mc2_plan(_facts(), lambda: "hccl-ep")
    assert (plan.group, plan.world, plan.rank, plan.local, plan.global_bs, plan.every_step) == (
        "hccl-ep", 16, 3, 16, 256 * 16, True)
    cases = {
        "setting": ("allgather", "'allgather'"), "exchange": (False, "no expert-parallel"),
        "linear": (False, "linearly"), "dtype": (torch.float32, "float32"),
        "hidden": (512, "hidden size 512 not in [1024, 7168]"),
        "family": ("A5", "A2/A3 only"), "top_k": (17, "top-k 17"),
        "replicated": (True, "TP ranks hold the same tokens"),
    }
    for key, (value, needle) in cases.items():
        why = declined(_facts(**{key: value}))
        assert why and any(needle in w for w in why), (key, why)
        assert mc2_plan(_facts(**{key: value}), lambda: pytest.fail("asked")) is None


def test_a2_takes_mc2_only_at_its_documented_ep_sizes():
    a2 = dict(family="A2", capacity=256, ep_world_size=16, experts=256)
    assert declined(_facts(**a2)) == []                     # 16 experts per rank <= 24
    assert any("not in (16, 32, 64)" in w for w in declined(_facts(**{**a2, "ep_world_size": 8})))
    assert any("32 experts per rank > 24" in w
               for w in declined(_facts(**{**a2, "ep_world_size": 16, "experts": 512})))
    assert any("multiple of 32" in w for w in declined(_facts(**{**a2, "hidden": 1000})))


def test_a_step_budget_beyond_the_documented_tokens_gives_a_step_sized_plan():
    """Buffers for the SoC's documented tokens per rank (A3 512, A2 256), not the budget;
    ``every_step`` only when the budget fits them. W8A8 experts take MC2 too."""
    for family, bound, ep in (("A3", 512, 16), ("A2", 256, 16)):
        for capacity in (bound, bound + 1, 8192):
            plan = mc2_plan(_facts(family=family, capacity=capacity, ep_world_size=ep),
                            lambda: "g")
            assert (plan.tokens, plan.global_bs) == (min(capacity, bound), min(capacity, bound) * ep)
            assert plan.every_step == (capacity <= bound)
    assert mc2_plan(_facts(capacity=100), lambda: "g").tokens == 100


def test_each_step_takes_mc2_up_to_the_plans_tokens_then_all_to_all_or_all_gather():
    """The per-step choice (pure): with an MC2 plan, the step's most tokens per rank decide
    (a plan for every step takes every step its budget allows, and a larger one would go
    to the all-gather rather than past its buffers); without one, they are never asked."""
    sized = mc2_plan(_facts(capacity=4096), lambda: "g")
    whole = mc2_plan(_facts(capacity=256), lambda: "g")
    never = lambda: pytest.fail("asked for the step's tokens")     # noqa: E731
    assert step_route(whole, False, lambda: 256) == step_route(whole, True, lambda: 1) == MC2
    assert step_route(whole, False, lambda: 257) == ALLGATHER
    assert step_route(None, True, never) == ALLTOALL
    assert step_route(None, False, never) == LOCAL
    for tokens, alltoall, want in ((1, False, MC2), (512, False, MC2), (513, False, ALLGATHER),
                                   (4096, False, ALLGATHER), (512, True, MC2),
                                   (513, True, ALLTOALL)):
        assert step_route(sized, alltoall, lambda t=tokens: t) == want, (tokens, alltoall)


def test_a_graph_step_never_takes_the_all_to_all():
    """A step captured into a decode graph cannot hold the all-to-all's host-read sizes:
    it takes MC2 where the plan covers it, else the all-gather (sizes vLLM pads alike on
    every DP rank); eager steps are unchanged."""
    sized = mc2_plan(_facts(capacity=4096), lambda: "g")
    never = lambda: pytest.fail("asked for the step's tokens")     # noqa: E731
    yes, no = (lambda: True), (lambda: False)
    assert step_route(None, True, never, graph=yes) == ALLGATHER
    assert step_route(None, True, never, graph=no) == ALLTOALL
    assert step_route(None, False, never, graph=never) == LOCAL
    assert step_route(sized, True, lambda: 8, graph=never) == MC2
    assert step_route(sized, True, lambda: 513, graph=yes) == ALLGATHER
    assert step_route(sized, True, lambda: 513, graph=no) == ALLTOALL


def test_moe_dispatch_mc2_refuses_naming_every_reason():
    with pytest.raises(Mc2Refused, match=r"'mc2' but MC2 cannot run here: .*float32.*"
                                         r"hidden size 128"):
        mc2_plan(_facts(setting="mc2", hidden=128, dtype=torch.float32), lambda: "x")
    assert bounds.outside("A3", hidden=1024, bs=1, top_k=1, experts=2, ep_world_size=2) == []
