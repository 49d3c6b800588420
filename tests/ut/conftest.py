"""Fixtures shared by unit tests."""

from __future__ import annotations

import pytest

from vllm_ascend_ext.contract import mode
from vllm_ascend_ext.contract.harness import Harness
from vllm_ascend_ext.platform.soc import from_name


@pytest.fixture
def contract(monkeypatch):
    """Contract mode on, with a fresh harness pretending the chip asked for (an A2 until
    the test asks for another with ``contract(soc)``)."""
    monkeypatch.setenv(mode.ENV, "1")

    def use(soc: str = "ascend910b2") -> Harness:
        h = Harness(from_name(soc))
        monkeypatch.setattr(mode, "_HARNESS", [h])
        mode.install()   # what enabled() does: the harness stands in for torch_npu
        return h

    use()
    return use


# What every rank process needs imported: a fork server imports it once per test process,
# and each rank forks from it (a spawned rank imported vLLM itself, ~9 s each).
RANK_PRELOAD = ["torch", "torch.distributed", "vllm.distributed.parallel_state",
                "vllm_ascend_ext.distributed.communicator", "vllm_ascend_ext.moe.experts"]


def rank_context():
    """The multiprocessing context of the ranks: a fork server with ``RANK_PRELOAD``
    imported (clean: it has run nothing; each rank a fresh fork of it). The ranks get the
    fork server's environment, the test process's when it first started: a rank worker
    sets what it needs itself (``os.environ`` in the worker), not the test before it."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(RANK_PRELOAD)
    return ctx


def spawn_ranks(worker, world: int, store: str, timeout: float = 180) -> dict:
    """Run ``worker(rank, world, store, queue)`` in ``world`` processes (a gloo group over
    the file rendezvous ``store``); each puts ``(rank, result)`` on the queue. Returns
    ``{rank: result}`` once every process has exited 0."""
    ctx = rank_context()
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, world, store, queue)) for r in range(world)]
    for p in procs:
        p.start()
    got = dict(queue.get(timeout=timeout) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return got
