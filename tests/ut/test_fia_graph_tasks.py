"""FIA in a captured decode graph: host lists updated on every replay.

``StandInGraphs`` plays torch.npu's graph-task API with the NPU's semantics, on a CPU: a
captured FIA task is recorded, not run; a replay runs every task with the parameters it
holds (those of the capture, until an update re-issues it) and waits for each task's
event, which only an update records. The FIA layers, metadata builder and the runner's
post-replay hook are the plugin's own; expected outputs are dense attention.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch
from vllm.config import CUDAGraphMode
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.kv_cache_interface import FullAttentionSpec

from tests.ut.dense import dense_attention
from vllm_ascend_ext.attention.fia import graph_tasks
from vllm_ascend_ext.attention.fia.builder import AscendFIAMetadataBuilder
from vllm_ascend_ext.attention.fia.graph_tasks import FiaGraphTasks
from vllm_ascend_ext.attention.fia.impl import AscendFIAImpl
from vllm_ascend_ext.attention.fia.plan import BatchMetadataError
from vllm_ascend_ext.ops.fia import npu_fused_infer_attention_score
from vllm_ascend_ext.worker.npu_model_runner import update_graph_tasks

NQ, NKV, D, BS, NB = 4, 2, 64, 16, 12
CAPTURED = [5, 9, 3]   # kv lengths of the step the graph was captured on (decode, q len 1)
NEXT = [6, 18, 4]     # the following decode step, replayed on the same graph


class StandInEvent:
    def __init__(self):
        self.recorded = False

    def wait(self, stream):
        pass

    def reset(self, stream):
        self.recorded = False

    def record(self, stream):
        self.recorded = True


class StandInGraphs:
    """torch.npu's graph-task API on a CPU, with NPU semantics (see module docstring)."""

    def __init__(self):
        self.capturing = False
        self.groups: list[list] = []
        self.events: list[StandInEvent] = []
        self._open: list | None = None
        self._updating: int | None = None
        self.workspace_lists: list = []

    def is_current_stream_capturing(self):
        return self.capturing

    def current_stream(self):
        return "main"

    def Stream(self):  # noqa: N802 - torch.npu's name
        return "side"

    @contextmanager
    def stream(self, s):
        yield

    def ExternalEvent(self):  # noqa: N802
        event = StandInEvent()
        self.events.append(event)
        return event

    def graph_task_group_begin(self, stream):
        assert self.capturing and self._open is None
        self._open = []

    def graph_task_group_end(self, stream):
        handle = len(self.groups)
        self.groups.append(self._open)
        self._open = None
        return handle

    def graph_task_update_begin(self, stream, handle):
        assert not self.capturing and stream == "side"
        self._updating = handle

    def graph_task_update_end(self, stream):
        self._updating = None

    def fia_out(self, *args, **kwargs):
        if self._open is not None:          # captured: recorded, not run
            self._open.append((args, kwargs))
        elif self._updating is not None:    # an update re-issues the task
            self.groups[self._updating] = [(args, kwargs)]
        else:
            raise AssertionError("FIA .out issued outside a task group")

    def fia_workspace(self, *args, **kwargs):
        self.workspace_lists.append(kwargs["actual_seq_lengths_kv"])
        return torch.empty(0)

    def replay(self):
        for group, event in zip(self.groups, self.events):
            assert event.recorded, "replay would wait forever: no update recorded the event"
            event.reset("main")
            for args, kwargs in group:
                kw = dict(kwargs)
                out = kw.pop("out")
                kw.pop("workspace")
                attn, _ = npu_fused_infer_attention_score(*args, **kw)
                out[0].copy_(attn)


def _metadata(kv_lens, tasks):
    n = len(kv_lens)
    qsl = torch.arange(n + 1, dtype=torch.int32)
    table = torch.arange(NB, dtype=torch.int32).view(n, NB // n)
    slots = [int(table[b, (L - 1) // BS]) * BS + (L - 1) % BS for b, L in enumerate(kv_lens)]
    cam = CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl,
        seq_lens=torch.tensor(kv_lens, dtype=torch.int32), num_reqs=n, num_actual_tokens=n,
        max_query_len=1, max_seq_len=max(kv_lens), block_table_tensor=table,
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        seq_lens_cpu_upper_bound=torch.tensor(kv_lens, dtype=torch.int32))
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=NKV, head_size=D, dtype=torch.float32)
    md = AscendFIAMetadataBuilder(spec, ["layer.0"], None, torch.device("cpu"),
                                  mode="off").build(0, cam)
    return dataclasses.replace(md, graph_tasks=tasks), table


def _world(seed=0):
    torch.manual_seed(seed)
    n = len(CAPTURED)
    seq_k = [torch.randn(max(NEXT), NKV, D) for _ in range(n)]
    seq_v = [torch.randn(max(NEXT), NKV, D) for _ in range(n)]
    kv_cache = torch.zeros(NB, NKV, BS, 2 * D)
    planes = kv_cache.view(NB, 2, BS, NKV, D)
    table = torch.arange(NB, dtype=torch.int32).view(n, NB // n)
    for b in range(n):
        for p in range(max(NEXT)):
            planes[int(table[b, p // BS]), 0, p % BS] = seq_k[b][p]
            planes[int(table[b, p // BS]), 1, p % BS] = seq_v[b][p]
    query = torch.randn(n, NQ * D)
    return seq_k, seq_v, kv_cache, query


def _capture(standin, layers, kv_cache, query, seq_k, seq_v):
    tasks = FiaGraphTasks(standin, standin.fia_out, standin.fia_workspace)
    md, _ = _metadata(CAPTURED, tasks)
    # The new token of each request is the one the cache already holds at its position.
    key = torch.stack([seq_k[b][L - 1] for b, L in enumerate(CAPTURED)]).view(-1, NKV * D)
    value = torch.stack([seq_v[b][L - 1] for b, L in enumerate(CAPTURED)]).view(-1, NKV * D)
    standin.capturing = True
    outputs = [torch.zeros_like(query) for _ in layers]
    for impl, out in zip(layers, outputs):
        impl.forward(None, query, key, value, kv_cache, md, out)
    standin.capturing = False
    return tasks, outputs


def _dense(query, seq_k, seq_v, kv_lens):
    q = query.view(-1, 1, NQ, D)
    return torch.cat([
        dense_attention(q[b], seq_k[b][:L], seq_v[b][:L], D**-0.5, lambda i, j: True)[0]
        for b, L in enumerate(kv_lens)]).float()


def test_a_replayed_decode_graph_computes_the_replayed_steps_attention():
    seq_k, seq_v, kv_cache, query = _world()
    standin = StandInGraphs()
    layers = [AscendFIAImpl(NQ, D, D**-0.5, NKV) for _ in range(2)]
    tasks, _ = _capture(standin, layers, kv_cache, query, seq_k, seq_v)
    assert [len(g) for g in standin.groups] == [1, 1] and list(tasks.tasks) == [len(CAPTURED)]
    assert standin.workspace_lists == [tuple(CAPTURED)] * 2  # sized at capture
    buffers = [t.kwargs["out"][0] for t in tasks.tasks[len(CAPTURED)]]

    md_next, _ = _metadata(NEXT, tasks)
    ctx = SimpleNamespace(cudagraph_runtime_mode=CUDAGraphMode.FULL,
                          batch_descriptor=SimpleNamespace(num_tokens=len(NEXT)),
                          attn_metadata={"layer.0": md_next, "layer.1": md_next})
    assert update_graph_tasks(ctx) == 2          # both layers' tasks, once each
    standin.replay()
    expected = _dense(query, seq_k, seq_v, NEXT)
    for buf in buffers:
        torch.testing.assert_close(buf, expected, atol=1e-5, rtol=1e-5)
    # Negative control: the capture step's lists give different attention.
    assert not torch.allclose(_dense(query, seq_k, seq_v, CAPTURED), expected, atol=1e-3)


def test_without_an_update_a_replay_would_run_the_captured_lists():
    seq_k, seq_v, kv_cache, query = _world(1)
    standin = StandInGraphs()
    tasks, _ = _capture(standin, [AscendFIAImpl(NQ, D, D**-0.5, NKV)], kv_cache, query,
                        seq_k, seq_v)
    with pytest.raises(AssertionError, match="wait forever"):
        standin.replay()                         # the graph waits on the update's event
    for event in standin.events:                 # released without new parameters:
        event.record("side")
    standin.replay()
    stale = tasks.tasks[len(CAPTURED)][0].kwargs["out"][0]
    torch.testing.assert_close(stale, _dense(query, seq_k, seq_v, CAPTURED), atol=1e-5,
                               rtol=1e-5)
    assert not torch.allclose(stale, _dense(query, seq_k, seq_v, NEXT), atol=1e-3)


@pytest.mark.parametrize("mode", [CUDAGraphMode.NONE, CUDAGraphMode.PIECEWISE])
def test_eager_and_piecewise_steps_update_nothing(mode):
    standin = StandInGraphs()
    tasks = FiaGraphTasks(standin, standin.fia_out, standin.fia_workspace)
    md, _ = _metadata(NEXT, tasks)
    ctx = SimpleNamespace(cudagraph_runtime_mode=mode,
                          batch_descriptor=SimpleNamespace(num_tokens=3),
                          attn_metadata={"layer.0": md})
    assert update_graph_tasks(ctx) == 0


def test_an_update_with_another_batch_size_fails_loudly():
    seq_k, seq_v, kv_cache, query = _world()
    standin = StandInGraphs()
    tasks, _ = _capture(standin, [AscendFIAImpl(NQ, D, D**-0.5, NKV)], kv_cache, query,
                        seq_k, seq_v)
    with pytest.raises(BatchMetadataError, match="2 requests in this step's host lists, 3 at"):
        tasks.update(len(CAPTURED), {"actual_seq_lengths": (1, 2),
                                     "actual_seq_lengths_kv": (4, 5)})


def test_graph_tasks_exist_only_on_an_npu_with_full_graphs():
    config = SimpleNamespace(compilation_config=SimpleNamespace(
        cudagraph_mode=CUDAGraphMode.FULL_DECODE_ONLY))
    assert graph_tasks.for_device(config, torch.device("cpu")) is None
    assert graph_tasks.for_device(None, "cpu") is None
