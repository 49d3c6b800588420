"""Collectives inside a captured graph on the CPU stand-in (emulation/cpu_npu_graph.py),
over a real two-rank gloo group and the plugin's communicator: as an HCCL collective
captured into an aclgraph, a replay re-runs the exchange on the same buffers with what
they hold at replay, and completes it before the next recorded call reads them. Values
are checked against sums and concatenations computed here from the ranks' inputs."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tests.ut.conftest import spawn_ranks

SIZES = [3, 1]


def _capture_and_replay(rank: int, comm, group, rt, functional: bool) -> dict:
    rows = torch.zeros(SIZES[rank], 4)           # buffers written outside the graph
    full = torch.zeros(sum(SIZES), 4)
    vec = torch.zeros(5)
    out = {}
    g = rt.NPUGraph()
    with rt.graph(g):
        gathered = comm.all_gatherv(rows, dim=0, sizes=SIZES) * 1.0
        scattered = comm.reduce_scatterv(full, dim=0, sizes=SIZES) + 0.0
        if functional:       # what Dynamo traces dist.all_reduce into
            fc = torch.ops._c10d_functional
            pending = fc.all_reduce(vec * 1.0, "sum", group.group_name)
            reduced = fc.wait_tensor(pending) + 0.0
        else:
            reduced = comm.all_reduce(vec.clone()) + 0.0
    out["collectives"] = g.collectives()
    for step in (1, 2):      # new values in the buffers, then a replay
        rows.copy_(step * 10 * (rank + 1) + torch.arange(SIZES[rank] * 4.0).view(-1, 4))
        full.copy_(step * (rank + 1) * torch.arange(sum(SIZES) * 4.0).view(-1, 4))
        vec.copy_(torch.full((5,), float(step * (rank + 1))))
        g.replay()
        out[step] = {"gathered": gathered.tolist(), "scattered": scattered.tolist(),
                     "reduced": reduced.tolist()}
    return out


def _worker(rank: int, world: int, store: str, queue) -> None:
    from vllm_ascend_ext.distributed.communicator import AscendCommunicator
    from vllm_ascend_ext.emulation import cpu_npu

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    group = dist.group.WORLD
    comm = AscendCommunicator(group, torch.device("cpu"), group, unique_name="dp:0")
    rt = cpu_npu.make_runtime()
    queue.put((rank, {functional: _capture_and_replay(rank, comm, group, rt, functional)
                      for functional in (False, True)}))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    store = str(tmp_path_factory.mktemp("gloo") / "store")
    return spawn_ranks(_worker, 2, store, timeout=600)


@pytest.mark.xdist_group("graph_collectives")
@pytest.mark.parametrize("functional", [False, True], ids=["c10d", "functional"])
def test_a_replayed_graph_exchanges_what_the_buffers_hold_at_replay(results, functional):
    got = {rank: results[rank][functional] for rank in (0, 1)}
    for step in (1, 2):
        rows = [step * 10 * (r + 1) + torch.arange(SIZES[r] * 4.0).view(-1, 4) for r in (0, 1)]
        total = sum(step * (r + 1) * torch.arange(sum(SIZES) * 4.0).view(-1, 4) for r in (0, 1))
        begin = [0, SIZES[0]]
        for rank in (0, 1):
            r = got[rank][step]
            assert torch.equal(torch.tensor(r["gathered"]), torch.cat(rows))
            assert torch.equal(torch.tensor(r["scattered"]),
                               total[begin[rank]:begin[rank] + SIZES[rank]])
            assert r["reduced"] == [3.0 * step] * 5
    reduce = "_c10d_functional::all_reduce" if functional else "c10d::allreduce_"
    for rank in (0, 1):      # one recorded kernel per collective, nothing of their insides
        assert got[rank]["collectives"] == ["c10d::_allgather_base_",
                                            "c10d::_reduce_scatter_base_", reduce]
