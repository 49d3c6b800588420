"""FIA in a captured decode graph: host lists updated before every replay.

``StandInGraphs`` plays torch.npu's graph API with the NPU's semantics, on a CPU: while
capturing, the K/V cache write and each FIA task are recorded, not run; a replay runs
the recorded operations again on the tensors they were captured with (so it sees what
has since been written into those tensors, and nothing else), each FIA task with the
parameters it holds (the capture's, until an update re-issues it), and waits for each
task's event, which only an update records. The FIA layers, the metadata builder (its
persistent buffers), the update and the graph wrapper are the plugin's own; expected
outputs are dense attention over each step's sequences.
"""

from __future__ import annotations

import dataclasses
import functools
from contextlib import contextmanager

import pytest
import torch
from vllm.compilation.cuda_graph import CUDAGraphEntry
from vllm.config import CUDAGraphMode, ModelConfig, VllmConfig
from vllm.forward_context import BatchDescriptor, set_forward_context
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.kv_cache_interface import FullAttentionSpec

from tests.ut.dense import dense_attention
from vllm_ascend_ext.attention.fia import graph_tasks, impl
from vllm_ascend_ext.attention.fia.builder import AscendFIAMetadataBuilder
from vllm_ascend_ext.attention.fia.graph_tasks import FiaGraphTasks, update_before_replay
from vllm_ascend_ext.attention.fia.impl import AscendFIAImpl
from vllm_ascend_ext.attention.fia.plan import BatchMetadataError, pad_to_graph
from vllm_ascend_ext.ops.fia import npu_fused_infer_attention_score
from vllm_ascend_ext.ops.fia_checks import FIAArgumentError

NQ, NKV, D, BS, NB = 4, 2, 64, 16, 16
KEY = BatchDescriptor(num_tokens=3, num_reqs=3, uniform=True)
CAPTURED = [5, 9, 3]   # kv lengths of the step the graph was captured on (decode, q len 1)
NEXT = [6, 18, 4]      # the step replayed on that graph, with other blocks


class StandInEvent:
    def __init__(self):
        self.recorded = False

    def wait(self, stream):
        pass

    def reset(self, stream):
        self.recorded = False

    def record(self, stream):
        self.recorded = True


class StandInStream:
    def __init__(self, name):
        self.name, self.waited_on = name, []

    def wait_stream(self, other):
        self.waited_on.append(other.name)


class StandInGraphs:
    """torch.npu's graph and graph-task API on a CPU, with NPU semantics (see above)."""

    def __init__(self):
        self.capturing = False
        self.ops: list = []            # captured, in order: ("write", args) / ("fia", group)
        self.groups: list[list] = []
        self.events: list[StandInEvent] = []
        self.main = StandInStream("main")
        self._open: list | None = None
        self._updating: int | None = None
        self.workspace_lists: list = []
        self.log: list[str] = []

    # -- torch.npu names -----------------------------------------------------------
    def is_current_stream_capturing(self):
        return self.capturing

    def current_stream(self):
        return self.main

    def Stream(self):  # noqa: N802 - torch.npu's name
        return StandInStream("side")

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
        self.ops.append(("fia", handle))
        self._open = None
        return handle

    def graph_task_update_begin(self, stream, handle):
        assert not self.capturing and stream.name == "side"
        self._updating = handle

    def graph_task_update_end(self, stream):
        self._updating = None

    # -- torch_npu operators -------------------------------------------------------
    def fia_out(self, *args, **kwargs):
        if self._open is not None:          # captured: recorded, not run
            self._open.append((args, kwargs))
        elif self._updating is not None:    # an update re-issues the task
            self.groups[self._updating] = [(args, kwargs)]
            self.log.append("update")
        else:
            raise AssertionError("FIA .out issued outside a task group")

    def fia_workspace(self, *args, **kwargs):
        self.workspace_lists.append(tuple(kwargs["actual_seq_lengths_kv"]))
        return torch.empty(0)

    def writer(self, real):
        def write(*args, **kwargs):
            if self.capturing:
                self.ops.append(("write", (args, kwargs)))
            else:
                real(*args, **kwargs)
        return write

    # -- the graph -----------------------------------------------------------------
    def replay(self):
        self.log.append("replay")
        for kind, what in self.ops:
            if kind == "write":
                args, kwargs = what
                self.real_writer(*args, **kwargs)
                continue
            event = self.events[what]
            assert event.recorded, "replay would wait forever: no update recorded the event"
            event.reset(self.main)
            for args, kwargs in self.groups[what]:
                kw = dict(kwargs)
                out = kw.pop("out")
                kw.pop("workspace")
                attn, _ = npu_fused_infer_attention_score(*args, **kw)
                out[0].copy_(attn)


@pytest.fixture
def standin(monkeypatch):
    s = StandInGraphs()
    s.real_writer = impl.npu_scatter_pa_kv_cache
    monkeypatch.setattr(impl, "npu_scatter_pa_kv_cache", s.writer(s.real_writer))
    return s


def _spec():
    return FullAttentionSpec(block_size=BS, num_kv_heads=NKV, head_size=D, dtype=torch.float32)


def _builder(tasks=None):
    return AscendFIAMetadataBuilder(_spec(), ["layer.0"], None, torch.device("cpu"),
                                    mode="off", tasks=tasks)


def _cam(kv_lens, table):
    n = len(kv_lens)
    qsl = torch.arange(n + 1, dtype=torch.int32)
    slots = [int(table[b, (L - 1) // BS]) * BS + (L - 1) % BS for b, L in enumerate(kv_lens)]
    return CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl,
        seq_lens=torch.tensor(kv_lens, dtype=torch.int32), num_reqs=n, num_actual_tokens=n,
        max_query_len=1, max_seq_len=max(kv_lens), block_table_tensor=table,
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        seq_lens_cpu_upper_bound=torch.tensor(kv_lens, dtype=torch.int32))


def _step(kv_lens, table, kv_cache, seed):
    """A decode step: the cached history (all but the last token of each request) written
    through ``table``; returns (q, k, v of the new tokens, expected dense attention)."""
    g = torch.Generator().manual_seed(seed)
    n = len(kv_lens)
    seq_k = [torch.randn(L, NKV, D, generator=g) for L in kv_lens]
    seq_v = [torch.randn(L, NKV, D, generator=g) for L in kv_lens]
    planes = kv_cache.view(NB, 2, BS, NKV, D)
    for b, L in enumerate(kv_lens):
        for p in range(L - 1):
            planes[int(table[b, p // BS]), 0, p % BS] = seq_k[b][p]
            planes[int(table[b, p // BS]), 1, p % BS] = seq_v[b][p]
    q = torch.randn(n, NQ * D, generator=g)
    k = torch.stack([s[-1] for s in seq_k]).reshape(n, -1)
    v = torch.stack([s[-1] for s in seq_v]).reshape(n, -1)
    expected = torch.cat([dense_attention(q.view(n, 1, NQ, D)[b], seq_k[b], seq_v[b], D**-0.5,
                                          lambda i, j: True)[0] for b in range(n)]).float()
    return q, k, v, expected


TABLE_A = torch.arange(12, dtype=torch.int32).view(3, 4) + 1
TABLE_B = torch.tensor([[9, 14, 2, 7], [5, 11, 13, 3], [15, 8, 4, 10]], dtype=torch.int32)


def _capture(standin, n_layers=1):
    """Capture a decode graph on step A; returns (tasks, layers, static q/k/v, cache)."""
    tasks = FiaGraphTasks(standin, standin.fia_out, standin.fia_workspace)
    builder = _builder(tasks)
    kv_cache = torch.zeros(NB, NKV, BS, 2 * D)
    q, k, v, _ = _step(CAPTURED, TABLE_A, kv_cache, seed=0)
    md = builder.build(0, _cam(CAPTURED, TABLE_A))
    layers = [AscendFIAImpl(NQ, D, D**-0.5, NKV) for _ in range(n_layers)]
    standin.capturing = True   # as inside vLLM's wrapper: the graph's batch descriptor
    with set_forward_context({"layer.0": md}, _wrapper_config(),
                             cudagraph_runtime_mode=CUDAGraphMode.FULL, batch_descriptor=KEY):
        for layer in layers:
            layer.forward(None, q, k, v, kv_cache, md, torch.zeros_like(q))
    standin.capturing = False
    return tasks, builder, (q, k, v), kv_cache


def _next_step(builder, static, kv_cache, table=TABLE_B):
    """Step B's inputs written into the graph's static tensors; returns its metadata."""
    q, k, v, expected = _step(NEXT, table, kv_cache, seed=1)
    for buf, new in zip(static, (q, k, v)):
        buf.copy_(new)
    return builder.build(0, _cam(NEXT, table)), expected


def test_a_replayed_decode_graph_computes_the_replayed_steps_attention(standin):
    tasks, builder, static, kv_cache = _capture(standin, n_layers=2)
    assert [kind for kind, _ in standin.ops] == ["write", "fia", "write", "fia"]
    assert standin.workspace_lists == [tuple(CAPTURED)] * 2
    md, expected = _next_step(builder, static, kv_cache)
    assert update_before_replay({"layer.0": md, "layer.1": md}, KEY) == 2
    assert standin.log == ["update", "update"]           # before the replay
    standin.replay()
    for task in tasks.tasks[KEY]:
        torch.testing.assert_close(task.kwargs["out"][0].view(len(NEXT), -1, D),
                                   expected, atol=1e-5, rtol=1e-5)
    # The update waited for the work queued before it (the previous replay).
    assert tasks._stream.waited_on == ["main"]


def test_a_graphs_tasks_write_into_the_layer_outputs_and_share_one_workspace(standin,
                                                                            monkeypatch):
    """No per-task output buffer: each FIA task of a captured graph writes into its layer's
    output (which the graph holds anyway) and the graph's tasks share one workspace, so
    the layer's output holds the replayed step's attention with no copy after it."""
    weak: set[int] = set()     # the tensors the tasks keep only weakly (vLLM's weak_ref)
    monkeypatch.setattr(graph_tasks, "weak_ref",
                        lambda t: weak.add(id(alias := t.view(t.shape))) or alias)
    tasks = FiaGraphTasks(standin, standin.fia_out, standin.fia_workspace)
    builder = _builder(tasks)
    kv_cache = torch.zeros(NB, NKV, BS, 2 * D)
    q, k, v, _ = _step(CAPTURED, TABLE_A, kv_cache, seed=0)
    md = builder.build(0, _cam(CAPTURED, TABLE_A))
    layers = [AscendFIAImpl(NQ, D, D**-0.5, NKV) for _ in range(3)]
    outputs = [torch.zeros_like(q) for _ in layers]
    strided = torch.zeros(q.shape[1], q.shape[0]).t()    # the control: not contiguous
    standin.capturing = True
    with set_forward_context({"layer.0": md}, _wrapper_config(),
                             cudagraph_runtime_mode=CUDAGraphMode.FULL, batch_descriptor=KEY):
        for layer, out in zip(layers, outputs):
            layer.forward(None, q, k, v, kv_cache, md, out)
        layers[0].forward(None, q, k, v, kv_cache, md, strided)
    standin.capturing = False
    captured = tasks.tasks[KEY]
    assert len(captured) == 4
    for task, out in zip(captured, outputs):
        assert task.kwargs["out"][0].data_ptr() == out.data_ptr()
    assert captured[3].kwargs["out"][0].data_ptr() != strided.data_ptr()  # a buffer of its own
    assert len({id(task.kwargs["workspace"]) for task in captured}) == 1
    assert list(tasks.workspaces) == [KEY]
    for task in captured:   # no tensor of the graph kept alive by a task but its workspace
        assert {id(a) for a in task.args} | {id(task.kwargs["out"][0])} <= weak
    md, expected = _next_step(builder, (q, k, v), kv_cache)
    update_before_replay({"layer.0": md}, KEY)
    for out in outputs:
        out.zero_()
    standin.replay()
    for out in outputs:
        torch.testing.assert_close(out.view(len(NEXT), -1, D), expected, atol=1e-5, rtol=1e-5)
    tasks.clear()
    assert not tasks.workspaces


def test_without_persistent_buffers_a_replay_reads_the_captured_steps_blocks(standin):
    """Negative control: step B's block table and slots in new tensors (what a builder
    without decode graphs makes) leave the graph reading the capture step's."""
    tasks, _, static, kv_cache = _capture(standin)
    md, expected = _next_step(_builder(), static, kv_cache)
    md = dataclasses.replace(md, graph_tasks=tasks)
    update_before_replay({"layer.0": md}, KEY)
    standin.replay()
    got = tasks.tasks[KEY][0].kwargs["out"][0].view(len(NEXT), -1, D)
    assert not torch.allclose(got, expected, atol=1e-3)


def test_without_an_update_a_replay_waits_or_runs_the_captured_lists(standin):
    tasks, builder, static, kv_cache = _capture(standin)
    md, expected = _next_step(builder, static, kv_cache)
    with pytest.raises(AssertionError, match="wait forever"):
        standin.replay()                         # the graph waits on the update's event
    for event in standin.events:                 # released without new parameters:
        event.record(standin.main)
    standin.replay()
    stale = tasks.tasks[KEY][0].kwargs["out"][0].view(len(NEXT), -1, D)
    assert not torch.allclose(stale, expected, atol=1e-3)


def test_a_step_that_does_not_fit_the_graph_fails_before_anything_is_issued(standin):
    tasks, builder, static, kv_cache = _capture(standin)
    other = FiaGraphTasks(standin, standin.fia_out, standin.fia_workspace)
    other.tasks[KEY] = list(tasks.tasks[KEY])
    md = builder.build(0, _cam([4, 5], TABLE_B[:2]))
    fits = dataclasses.replace(builder.build(0, _cam(NEXT, TABLE_B)), graph_tasks=other)
    with pytest.raises(BatchMetadataError, match="no zero-length padding request can take"):
        update_before_replay({"a": fits, "b": md}, KEY)
    assert standin.log == []                     # the fitting group was not updated either
    with pytest.raises(BatchMetadataError, match="2 requests in this step's host lists, 3 at"):
        other.check(KEY, {"actual_seq_lengths": (1, 2), "actual_seq_lengths_kv": (4, 5)})


def _padded_cam(kv_lens, table, padded):
    """A decode step of ``len(kv_lens)`` requests padded to ``padded`` as vLLM's runner
    pads for a captured size: zero-length requests, null block rows, slots -1."""
    n = len(kv_lens)
    qsl = torch.tensor(list(range(n + 1)) + [n] * (padded - n), dtype=torch.int32)
    slots = [int(table[b, (L - 1) // BS]) * BS + (L - 1) % BS for b, L in enumerate(kv_lens)]
    rows = torch.cat([table[:n], torch.zeros(padded - n, table.shape[1], dtype=torch.int32)])
    return CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl,
        seq_lens=torch.tensor(list(kv_lens) + [0] * (padded - n), dtype=torch.int32),
        num_reqs=padded, num_actual_tokens=n, max_query_len=1, max_seq_len=max(kv_lens),
        block_table_tensor=rows, slot_mapping=torch.tensor(slots + [-1] * (padded - n)),
        seq_lens_cpu_upper_bound=torch.tensor(list(kv_lens) + [0] * (padded - n),
                                              dtype=torch.int32))


def _padded_step(standin):
    tasks, builder, static, kv_cache = _capture(standin)
    q, k, v, expected = _step(NEXT[:2], TABLE_B, kv_cache, seed=1)
    for buf, new in zip(static, (q, k, v)):
        buf.zero_()
        buf[:2].copy_(new)
    return tasks, builder.build(0, _padded_cam(NEXT[:2], TABLE_B, 3)), expected


def test_a_padded_batch_replays_with_its_padding_requests_given_the_graphs_tokens(standin):
    # 2 requests on the graph captured for 3: FIA in TND needs T (3) == the last query end
    tasks, md, expected = _padded_step(standin)
    assert md.actual_seq_lengths_q == (1, 2, 2)          # vLLM's zero-length padding
    assert update_before_replay({"layer.0": md}, KEY) == 1
    (args, kwargs), = standin.groups[tasks.tasks[KEY][0].handle]
    assert kwargs["actual_seq_lengths"] == (1, 2, 3)      # the padding request: 1 token
    assert kwargs["actual_seq_lengths_kv"] == (NEXT[0], NEXT[1], 1)
    standin.replay()
    got = tasks.tasks[KEY][0].kwargs["out"][0].view(3, -1, D)[:2]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_negative_control_unpadded_lists_break_fias_tnd_rule_on_replay(standin):
    tasks, md, _ = _padded_step(standin)
    tasks.update(KEY, {"actual_seq_lengths": md.actual_seq_lengths_q,
                       "actual_seq_lengths_kv": md.actual_seq_lengths_kv})
    with pytest.raises(FIAArgumentError, match="must equal the packed token count 3"):
        standin.replay()


def test_pad_to_graph_spreads_the_extra_tokens_over_the_padding_requests():
    assert pad_to_graph((1, 2, 2, 2), (6, 18, 0, 0), 5) == ((1, 2, 4, 5), (6, 18, 2, 1))
    assert pad_to_graph((1, 2, 3), (6, 18, 4), 3) == ((1, 2, 3), (6, 18, 4))   # full
    with pytest.raises(BatchMetadataError, match="no zero-length padding request"):
        pad_to_graph((1, 2), (6, 18), 3)
    with pytest.raises(BatchMetadataError, match="more than the graph's 2"):
        pad_to_graph((1, 2, 3), (6, 18, 4), 2)


@functools.cache
def _wrapper_config():
    from pathlib import Path

    tiny = Path(__file__).resolve().parents[4] / "vllm_ascend_ext" / "models" / "tiny_qwen3"
    return VllmConfig(model_config=ModelConfig(model=str(tiny), dtype=torch.float32,
                                               skip_tokenizer_init=True))


def test_the_npu_graph_wrapper_updates_before_every_replay_and_only_then(standin, monkeypatch):
    from vllm_ascend_ext.worker.npu_graph import AscendNPUGraphWrapper
    from vllm_ascend_ext.worker.npu_model_runner import npu_full_graph_wrapper

    config = _wrapper_config()
    monkeypatch.setattr(type(vllm_platform()), "graph_pool_handle", lambda self: None,
                        raising=False)
    calls = []
    wrapper = AscendNPUGraphWrapper(lambda *a: calls.append("eager"), config,
                                    runtime_mode=CUDAGraphMode.FULL)
    tasks, builder, static, kv_cache = _capture(standin)
    md, expected = _next_step(builder, static, kv_cache)

    class Graph:
        def replay(self):
            standin.replay()                     # asserts the events were recorded

    wrapper.concrete_cudagraph_entries[KEY] = CUDAGraphEntry(KEY, cudagraph=Graph(), output=7)
    with set_forward_context({"layer.0": md}, config, cudagraph_runtime_mode=CUDAGraphMode.FULL,
                             batch_descriptor=KEY):
        assert wrapper() == 7
    assert standin.log == ["update", "replay"]
    torch.testing.assert_close(tasks.tasks[KEY][0].kwargs["out"][0].view(len(NEXT), -1, D),
                               expected, atol=1e-5, rtol=1e-5)
    with set_forward_context({"layer.0": md}, config, cudagraph_runtime_mode=CUDAGraphMode.NONE,
                             batch_descriptor=KEY):
        wrapper()                                # eager: no update
    other = BatchDescriptor(num_tokens=8, num_reqs=8, uniform=True)
    with set_forward_context({"layer.0": md}, config, cudagraph_runtime_mode=CUDAGraphMode.FULL,
                             batch_descriptor=other):
        assert wrapper.replay_key() is None      # not captured yet: capture, no update
    assert standin.log == ["update", "replay"] and calls == ["eager"]
    # The runner swaps vLLM's FULL wrapper for this one, keeping the model it wraps.
    from vllm.compilation.cuda_graph import CUDAGraphWrapper

    stock = CUDAGraphWrapper(len, config, runtime_mode=CUDAGraphMode.FULL)
    swapped = npu_full_graph_wrapper(stock, config)
    assert type(swapped) is AscendNPUGraphWrapper and swapped.runnable is len
    assert npu_full_graph_wrapper(len, config) is len


def vllm_platform():
    from vllm.platforms import current_platform

    return current_platform


def test_graph_tasks_exist_only_on_an_npu_with_full_graphs():
    from types import SimpleNamespace

    config = SimpleNamespace(compilation_config=SimpleNamespace(
        cudagraph_mode=CUDAGraphMode.FULL_DECODE_ONLY))
    assert graph_tasks.for_device(config, torch.device("cpu")) is None
    assert graph_tasks.for_device(None, "cpu") is None


def test_graph_tasks_take_the_kernels_the_device_runtime_registered():
    """The attention code reaches the device through the runtime's registry
    (worker/npu_device.py): the kernels registered are the ones the tasks call; a runtime
    that registered none gets no tasks (FIA eager)."""
    from types import SimpleNamespace

    from vllm_ascend_ext.worker import npu_device

    config = SimpleNamespace(compilation_config=SimpleNamespace(
        cudagraph_mode=CUDAGraphMode.FULL_DECODE_ONLY))
    runtime = SimpleNamespace(name="a device runtime")

    def out(*args, **kwargs):
        return None

    def workspace(*args, **kwargs):
        return None

    try:
        npu_device.set_runtime(runtime, {npu_device.FIA_OUT: out,
                                         npu_device.FIA_WORKSPACE: workspace})
        tasks = graph_tasks.for_device(config, "cpu")
        assert tasks is not None and tasks.device is runtime
        assert (tasks.fia_out, tasks.fia_workspace) == (out, workspace)
        npu_device.set_runtime(runtime)                 # the control: nothing registered
        assert graph_tasks.for_device(config, "cpu") is None
    finally:
        npu_device.set_runtime(None)
    assert _builder().buffers is None            # eager builders keep fresh tensors
