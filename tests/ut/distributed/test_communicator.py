"""The plugin's device communicator (distributed/communicator.py) over a real two-rank
gloo group (the emulated platform's backend; HCCL runs the same calls on an NPU): every
collective against the value computed here from the ranks' known inputs."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tests.ut.conftest import spawn_ranks

SIZES = [3, 1]             # uneven rows per rank (DP ranks with different batch sizes)


def _rows(rank: int, n: int, width: int = 4) -> torch.Tensor:
    return rank * 100 + torch.arange(n * width, dtype=torch.float32).reshape(n, width)


def _full(rank: int) -> torch.Tensor:
    return (rank + 1) * torch.arange(sum(SIZES) * 2 * 3, dtype=torch.float32).reshape(
        sum(SIZES), 2, 3)


def _worker(rank: int, world: int, store: str, queue) -> None:
    from vllm_ascend_ext.distributed.communicator import AscendCommunicator

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    group = dist.group.WORLD
    comm = AscendCommunicator(group, torch.device("cpu"), group, unique_name="tp:0")
    out = {}
    mine = _rows(rank, SIZES[rank])
    out["gatherv"] = comm.all_gatherv(mine, dim=0, sizes=SIZES)
    out["gatherv_list"] = comm.all_gatherv([mine, mine[:, :1].long()], dim=0, sizes=SIZES)
    out["gatherv_dim1"] = comm.all_gatherv(mine.t().contiguous(), dim=1, sizes=SIZES)
    out["scatterv"] = comm.reduce_scatterv(_full(rank), dim=0, sizes=SIZES)
    out["scatterv_dim1"] = comm.reduce_scatterv(_full(rank).movedim(0, 1), dim=1, sizes=SIZES)
    out["scatter"] = comm.reduce_scatter(_full(rank)[:2], dim=0)
    out["all_reduce"] = comm.all_reduce(torch.full((2,), float(rank + 1)))
    out["all_gather"] = comm.all_gather(_rows(rank, 2), dim=-1)
    out["gather"] = comm.gather(_rows(rank, 2), dst=1, dim=0)
    out["broadcast"] = comm.broadcast(torch.full((2,), float(rank + 5)), src=1)
    out["ca_comm"] = comm.ca_comm is None        # what vLLM's graph_capture reads
    try:
        comm.all_gatherv(mine, dim=0, sizes=[2, 2])      # wrong on both ranks
    except ValueError as e:
        out["wrong_sizes"] = str(e)
    try:
        comm.combine(mine)
    except RuntimeError as e:
        out["no_manager"] = str(e)
    # plain lists: a tensor on the queue travels as a shared-memory handle that dies with
    # this process, which may exit before the parent has read it
    queue.put((rank, {k: _plain(v) for k, v in out.items()}))
    dist.destroy_process_group()


def _plain(value):
    if isinstance(value, torch.Tensor):
        return ("tensor", value.tolist(), str(value.dtype).removeprefix("torch."))
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _tensors(value):
    if isinstance(value, tuple) and value and value[0] == "tensor":
        return torch.tensor(value[1], dtype=getattr(torch, value[2]))
    if isinstance(value, list):
        return [_tensors(v) for v in value]
    return value


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    store = str(tmp_path_factory.mktemp("gloo") / "store")   # a file rendezvous: no port race
    got = spawn_ranks(_worker, 2, store, timeout=120)
    return {rank: {k: _tensors(v) for k, v in out.items()} for rank, out in got.items()}


@pytest.mark.xdist_group("communicator")
def test_variable_size_gathers_concatenate_every_ranks_rows(results):
    expected = torch.cat([_rows(0, SIZES[0]), _rows(1, SIZES[1])])
    for rank in (0, 1):
        r = results[rank]
        assert torch.equal(r["gatherv"], expected)
        assert torch.equal(r["gatherv_list"][0], expected)
        assert torch.equal(r["gatherv_list"][1], expected[:, :1].long())
        assert torch.equal(r["gatherv_dim1"], expected.t())
        assert "differ from sizes" in r["wrong_sizes"]


@pytest.mark.xdist_group("communicator")
def test_variable_size_reduce_scatter_keeps_each_ranks_slice_of_the_sum(results):
    total = _full(0) + _full(1)
    begin = [0, SIZES[0]]
    for rank in (0, 1):
        r = results[rank]
        mine = total[begin[rank]:begin[rank] + SIZES[rank]]
        assert torch.equal(r["scatterv"], mine)
        assert torch.equal(r["scatterv_dim1"], mine.movedim(0, 1))
        assert torch.equal(r["scatter"], total[:2][rank:rank + 1])
        assert torch.equal(r["all_reduce"], torch.full((2,), 3.0))
        assert torch.equal(r["all_gather"], torch.cat([_rows(0, 2), _rows(1, 2)], dim=-1))
        # a group vLLM did not ask to exchange MoE tokens refuses instead of a no-op
        assert "MoE token exchange" in r["no_manager"]
        assert torch.equal(r["broadcast"], torch.full((2,), 6.0))
        assert r["ca_comm"] is True
    # gather: rank 1 (the destination) holds both ranks' rows, rank 0 nothing
    assert results[0]["gather"] is None
    assert torch.equal(results[1]["gather"], torch.cat([_rows(0, 2), _rows(1, 2)]))


def test_vllms_graph_capture_accepts_the_communicator_and_nothing_of_xpus_runs():
    """vLLM's ``GroupCoordinator.graph_capture`` admits CUDA/XPU communicators only; the
    plugin's derives from XPU's for that check and redefines every method XPU's class
    defines (a vLLM upgrade adding one fails here), with no custom all-reduce."""
    from vllm.distributed.device_communicators.base_device_communicator import (
        DeviceCommunicatorBase,
    )
    from vllm.distributed.device_communicators.xpu_communicator import XpuCommunicator

    from vllm_ascend_ext.distributed.communicator import AscendCommunicator

    assert issubclass(AscendCommunicator, XpuCommunicator)
    # every name XPU's class defines (methods, properties, class attributes)
    xpu_own = {name for name in vars(XpuCommunicator)
               if not name.startswith("__") or name == "__init__"}
    assert xpu_own >= {"all_reduce", "reduce_scatter", "gather", "broadcast", "combine"}
    inherited = sorted(n for n in xpu_own if n not in vars(AscendCommunicator))
    assert inherited == [], f"XPU's definitions reach the NPU communicator: {inherited}"
    # every base-class method the plugin's class does not define resolves to the base's
    for name, value in vars(DeviceCommunicatorBase).items():
        if callable(value) and name not in vars(AscendCommunicator):
            assert getattr(AscendCommunicator, name) is value, name


def test_the_mc2_group_name_is_asked_with_the_global_rank(monkeypatch):
    """HCCL's communicator name of an EP group is asked with this process's global rank,
    as torch_npu documents ("传入的rankid为全局的rankid"; it selects the device): global
    rank 5 (rank 1 of an EP group {4, 5, 6, 7}) asks with 5."""
    from vllm_ascend_ext.distributed import communicator as module

    asked = []
    group = type("Group", (), {})()
    group._get_backend = lambda device: type("Backend", (), {
        "get_hccl_comm_name": staticmethod(lambda rank: asked.append(rank) or f"hccl{rank}")})()
    monkeypatch.setattr(module.dist, "get_backend", lambda g: "hccl")
    monkeypatch.setattr(module.dist, "get_rank", lambda g=None: 5 if g is None else 1)
    comm = module.AscendCommunicator.__new__(module.AscendCommunicator)
    comm.device_group, comm.device = group, torch.device("cpu")
    assert comm.moe_group_name() == "hccl5" and asked == [5]
