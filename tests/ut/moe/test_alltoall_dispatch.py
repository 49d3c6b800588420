"""The all-to-all token dispatcher (``moe/alltoall.py``) over real gloo groups of 2 and 3
ranks through the plugin's communicator (``AscendCommunicator.all_to_all_v``; HCCL's
AlltoAllV on an NPU): every rank's layer output against an explicit float64 loop over
every expert, with uneven tokens per rank, uneven experts per rank, vLLM's linear and
round-robin placements, a rank that receives no row, and W8A8 experts (fused and unfused)
against the same layer computed on one rank. Also counted: the calls per layer (three
all-to-alls, one host read). Negative control: a placement that renumbers two ranks'
experts sends rows to the wrong rank and changes the output. The gate and the placement
table are pure and tested without a group."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from vllm.model_executor.layers.fused_moe.expert_map_manager import determine_expert_map

from tests.ut.conftest import spawn_ranks
from vllm_ascend_ext.moe.alltoall import AllToAllRefused, alltoall_plan, declined, placement
from vllm_ascend_ext.moe.mc2 import Mc2Facts

E, K, H, INTER = 7, 3, 8, 4
TOKENS = [5, 2, 4]          # uneven tokens per rank (DP ranks with different batches)


def _maps(world: int, how: str) -> list[torch.Tensor]:
    return [determine_expert_map(world, r, E, how)[1] for r in range(world)]


def _inputs(rank: int):
    g = torch.Generator().manual_seed(50 + rank)
    t = TOKENS[rank]
    x = torch.randn(t, H, generator=g)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(t)]).to(torch.int32)
    return x, torch.rand(t, K, generator=g) + 0.1, ids


def _weights():
    g = torch.Generator().manual_seed(9)
    return (torch.randn(E, H, 2 * INTER, generator=g) / 3, torch.randn(E, INTER, H, generator=g) / 2,
            torch.randint(-127, 128, (E, H, 2 * INTER), generator=g, dtype=torch.int8),
            torch.rand(E, 2 * INTER, generator=g) / 50,
            torch.randint(-127, 128, (E, INTER, H), generator=g, dtype=torch.int8),
            torch.rand(E, H, generator=g) / 50)


def _facts(world: int, rank: int, **kw) -> Mc2Facts:
    base = dict(setting="alltoall", family="A2", exchange=True, linear=True,
                dtype=torch.float32, hidden=H, top_k=K, experts=E, ep_world_size=world,
                ep_rank=rank, capacity=8)
    return Mc2Facts(**{**base, **kw})


def _plan(world, rank, comm, maps):
    """Built when the layer is (not counted with the step)."""
    return alltoall_plan(_facts(world, rank), lambda: maps, lambda: comm)


def _layer(rank, plan, weights_of=None):
    """One layer through the dispatcher with this rank's float experts in vLLM's slot order
    (of the placement ``weights_of``: by default the plan's own), as ``layer(x, weights, ids)``."""
    from vllm_ascend_ext.moe import experts
    from vllm_ascend_ext.moe.alltoall import routed_experts_alltoall

    w13, w2 = _weights()[:2]
    owned = _owned(weights_of or plan, rank)
    mine13, mine2 = w13[owned].contiguous(), w2[owned].contiguous()
    return lambda x, weights, ids: routed_experts_alltoall(
        x, weights, ids, plan, lambda rows, s: experts.routed_experts(rows, None, s, mine13, mine2))


def _owned(plan, rank):
    """The global experts of ``rank`` in slot order, from the plan's rank-major numbering."""
    order = plan.order if plan.order is not None else torch.arange(E)
    begin = sum(plan.sizes[:rank])
    return [int(e) for e in torch.argsort(order.long())[begin:begin + plan.sizes[rank]]]


def _worker(rank: int, world: int, store: str, queue) -> None:
    from vllm_ascend_ext.distributed.communicator import AscendCommunicator
    from vllm_ascend_ext.moe import experts
    from vllm_ascend_ext.moe.alltoall import routed_experts_alltoall
    from vllm_ascend_ext.ops.counting import OpCounter
    from vllm_ascend_ext.ops.format import ACL_FORMAT_FRACTAL_NZ, npu_format_cast

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    comm = AscendCommunicator(dist.group.WORLD, torch.device("cpu"), dist.group.WORLD,
                              unique_name="ep:0")
    x, weights, ids = _inputs(rank)
    out = {}
    linear, robin = (_plan(world, rank, comm, _maps(world, how))
                     for how in ("linear", "round_robin"))
    for how, plan in (("linear", linear), ("round_robin", robin)):
        out[how] = _layer(rank, plan)(x, weights, ids)
    layer = _layer(rank, linear)
    with OpCounter() as c:
        layer(x, weights, ids)
    out["calls"] = dict(c.total())
    # no rank routes to rank 0's experts: rank 0 receives no row, yet sends all of its own
    others = [e for e in range(E) if e not in _owned(linear, 0)]
    out["lonely_ids"] = torch.tensor([[others[(t + k) % len(others)] for k in range(K)]
                                      for t in range(x.shape[0])], dtype=torch.int32)
    out["lonely"] = layer(x, weights, out["lonely_ids"])
    # negative control: every rank plans with round-robin placement but holds its linear
    # experts (the same count per rank): rows reach ranks that compute other experts
    out["swapped"] = _layer(rank, robin, weights_of=linear)(x, weights, ids)
    # W8A8 experts, bf16 activations, fused (NZ) and unfused local routes
    _, _, q13, s13, q2, s2 = _weights()
    xb = x.to(torch.bfloat16)
    plan, owned = linear, _owned(linear, rank)
    for fused in (False, True):
        run = experts.routed_experts_w8a8_fused if fused else experts.routed_experts_w8a8
        mine = (q13[owned].contiguous(), s13[owned], q2[owned].contiguous(), s2[owned])
        if fused:
            mine = (npu_format_cast(mine[0], ACL_FORMAT_FRACTAL_NZ), *mine[1:])
        out[f"w8a8_{fused}"] = routed_experts_alltoall(
            xb, weights, ids, plan, lambda rows, s, run=run, mine=mine: run(rows, None, s, *mine))
    queue.put((rank, {k: v.tolist() if isinstance(v, torch.Tensor) else v
                      for k, v in out.items()}))
    dist.destroy_process_group()


@pytest.fixture(scope="module", params=[2, 3])
def ranks(request, tmp_path_factory):
    world = request.param
    store = str(tmp_path_factory.mktemp(f"a2a_{world}") / "store")
    got = spawn_ranks(_worker, world, store)
    return world, got


def _loop(x, weights, ids):
    """sum_k weights[t, k] * FFN_{ids[t, k]}(x[t]) over every expert, float64."""
    w13, w2 = (w.double() for w in _weights()[:2])
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            gate, up = (x[t].double() @ w13[e]).chunk(2)
            out[t] += float(weights[t, k]) * ((torch.nn.functional.silu(gate) * up) @ w2[e])
    return out


def _got(got, rank, key):
    return torch.tensor(got[rank][key], dtype=torch.float64)


@pytest.mark.xdist_group("alltoall")
def test_every_rank_gets_its_tokens_whole_expert_sum(ranks):
    world, got = ranks
    for rank in range(world):
        x, weights, ids = _inputs(rank)
        want = _loop(x, weights, ids)
        for how in ("linear", "round_robin"):
            torch.testing.assert_close(_got(got, rank, how), want, rtol=1e-5, atol=1e-5)


@pytest.mark.xdist_group("alltoall")
def test_a_rank_that_receives_no_row_still_takes_part(ranks):
    world, got = ranks
    for rank in range(world):
        x, weights, _ = _inputs(rank)
        ids = torch.tensor(got[rank]["lonely_ids"], dtype=torch.int32)
        torch.testing.assert_close(_got(got, rank, "lonely"), _loop(x, weights, ids),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.xdist_group("alltoall")
def test_a_wrong_placement_changes_the_output(ranks):
    world, got = ranks
    for rank in range(world):
        x, weights, ids = _inputs(rank)
        assert (_got(got, rank, "swapped") - _loop(x, weights, ids)).abs().max() > 0.1


@pytest.mark.xdist_group("alltoall")
def test_w8a8_experts_equal_the_layer_on_one_rank(ranks):
    from vllm_ascend_ext.moe import experts
    from vllm_ascend_ext.ops.format import ACL_FORMAT_FRACTAL_NZ, npu_format_cast

    world, got = ranks
    _, _, q13, s13, q2, s2 = _weights()
    for rank in range(world):
        x, weights, ids = _inputs(rank)
        xb = x.to(torch.bfloat16)
        for fused in (False, True):
            if fused:
                whole = experts.routed_experts_w8a8_fused(
                    xb, weights, ids, npu_format_cast(q13, ACL_FORMAT_FRACTAL_NZ), s13, q2, s2)
            else:
                whole = experts.routed_experts_w8a8(xb, weights, ids, q13, s13, q2, s2)
            mine = _got(got, rank, f"w8a8_{fused}")
            # the same rows quantized the same way, summed once: equal up to bf16 rounding
            torch.testing.assert_close(mine, whole.double(), rtol=1e-2,
                                       atol=1e-2 * whole.abs().max().item())


@pytest.mark.xdist_group("alltoall")
def test_one_host_read_and_three_exchanges_per_layer(ranks):
    world, got = ranks
    for rank in range(world):
        calls = got[rank]["calls"]
        assert calls["ascend_ext.host_read"] == 1
        assert not {"aten._local_scalar_dense", "aten.nonzero", "aten.item"} & set(calls), calls
        assert calls["c10d.alltoall_base_"] == 3        # counts, rows out, rows back
        assert calls["npu_moe_init_routing_v2"] == 2     # by destination; by local expert
        assert calls["npu_moe_token_unpermute"] == 2     # to arrival order; the weighted sum
        assert calls["npu_grouped_matmul"] == 2 and calls["npu_swiglu"] == 1


# -- the gate and the placement table (pure) ---------------------------------------------
def test_placement_renumbers_round_robin_experts_rank_major():
    assert placement(_maps(3, "linear")).order is None          # already rank-major
    where = placement(_maps(3, "round_robin"))
    assert where.sizes == (3, 2, 2)
    # rank 0 holds 0, 3, 6; rank 1 holds 1, 4; rank 2 holds 2, 5
    assert where.order.tolist() == [0, 3, 5, 1, 4, 6, 2]
    maps = _maps(2, "linear")
    maps[1][0] = 0
    with pytest.raises(AllToAllRefused, match=r"experts \[0\] are placed on \[2\] ranks"):
        placement(maps)


def test_the_gate_takes_all_to_all_only_when_asked_and_says_why_not():
    never = lambda: pytest.fail("asked")       # noqa: E731
    assert alltoall_plan(_facts(2, 0, setting="auto"), never, never) is None
    assert alltoall_plan(_facts(2, 0, setting="mc2"), never, never) is None
    assert declined(_facts(2, 0)) == []
    for kw, needle in ((dict(exchange=False), "no expert-parallel token exchange"),
                       (dict(replicated=True), "TP ranks hold the same tokens")):
        with pytest.raises(AllToAllRefused, match=f"'alltoall' but all-to-all cannot run here: "
                                                  f".*{needle}"):
            alltoall_plan(_facts(2, 0, **kw), never, never)
    plan = alltoall_plan(_facts(3, 1, dtype=torch.bfloat16),
                         lambda: _maps(3, "linear"), lambda: "comm")
    assert (plan.world, plan.local, plan.sizes, plan.comm) == (3, 2, (3, 2, 2), "comm")
    assert plan.slots.tolist() == [0, 1] * 3 and plan.last.tolist() == [2, 4, 6]
