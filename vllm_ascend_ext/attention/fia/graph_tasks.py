"""FIA inside a captured decode graph: its host lists updated before every replay.

FIA takes the per-request sequence lengths as host lists (``SymInt[]``). A captured NPU
graph would replay the lists of the capture step forever. torch_npu's graph-task API
fixes that (``torch_npu.npu.graph_task_*``, documented for Atlas A2/A3):

* capture (the forward issues every FIA call through ``fia_call``: this while a graph
  is being captured, else a plain FIA call): each FIA call is issued as
  ``npu_fused_infer_attention_score.out`` into buffers owned by the graph, with the
  workspace ``_npu_fused_infer_attention_score_get_max_workspace`` returns for the call,
  between ``graph_task_group_begin(stream)`` and ``graph_task_group_end(stream)`` (which
  returns the task's handle), behind an ``ExternalEvent`` the graph waits on;
* before every replay (``worker/npu_graph.py``): on a side stream that first waits for
  the work already queued (the previous replay among it), for each task of the graph
  about to replay, ``graph_task_update_begin(stream, handle)``, the same ``.out`` call
  with this step's host lists, ``graph_task_update_end(stream)``, then the event is
  recorded, so the graph's FIA waits for its new parameters.

The device tensors a task reads (block table, slots) are the builder's persistent
buffers, rewritten in place each step (``builder.py``); only the host lists change here.

``FiaGraphTasks`` holds the tasks of every captured graph, keyed by vLLM's batch
descriptor of that graph; the device module (``torch.npu``) and the ``.out`` / workspace
callables are passed in, so the same code runs against a stand-in on a CPU
(``tests/ut/attention/fia/test_fia_graph_tasks.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from vllm_ascend_ext.attention.fia.plan import BatchMetadataError, pad_to_graph
from vllm_ascend_ext.ops.fia import npu_fused_infer_attention_score

# The FIA keywords that change from step to step and are updated on replay.
HOST_LISTS = ("actual_seq_lengths", "actual_seq_lengths_kv")


@dataclass
class FiaTask:
    handle: Any                      # graph_task_group_end's handle
    event: Any                       # ExternalEvent the captured FIA waits on
    args: tuple                      # (query, key, value) as captured (graph-owned)
    kwargs: dict                     # everything else but the host lists, incl. out/workspace
    num_reqs: int                    # length of the host lists at capture


@dataclass
class FiaGraphTasks:
    device: Any                                  # torch.npu (or a stand-in)
    fia_out: Callable[..., Any]                  # npu_fused_infer_attention_score.out
    fia_workspace: Callable[..., torch.Tensor]   # ..._get_max_workspace
    tasks: dict[Hashable, list[FiaTask]] = field(default_factory=dict)
    # One workspace per captured graph, shared by its FIA tasks (they run one after
    # another on the graph's stream), and the lse placeholder with it.
    workspaces: dict[Hashable, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    _stream: Any = None

    def capturing(self) -> bool:
        return bool(self.device.is_current_stream_capturing())

    def capture(self, key: Hashable, args: tuple, kwargs: dict,
                host_lists: dict[str, Sequence[int]],
                out: torch.Tensor | None = None) -> torch.Tensor:
        """Issue one FIA call as an updatable task of the graph being captured under
        ``key``; returns its attention output: ``out`` (the layer's output, which the
        graph owns already) when given, else a buffer of the graph's own. The graph's
        tasks share one workspace."""
        _check_lists(host_lists)
        query = args[0]
        stream = self.device.current_stream()
        workspace, lse = self._workspace(key, args, kwargs, host_lists)
        attn = torch.empty_like(query) if out is None else out
        # The task keeps weak references to the graph's tensors, as vLLM's capture keeps
        # its outputs: the graph pool may reuse their memory after their last use in the
        # graph (a replay reproduces every address). The shared workspace stays owned.
        args = tuple(weak_ref(a) for a in args)
        call = dict(kwargs, workspace=workspace, out=[weak_ref(attn), lse])
        event = self.device.ExternalEvent()
        event.wait(stream)
        event.reset(stream)
        self.device.graph_task_group_begin(stream)
        self.fia_out(*args, **call, **host_lists)
        handle = self.device.graph_task_group_end(stream)
        self.tasks.setdefault(key, []).append(
            FiaTask(handle, event, args, call, len(host_lists["actual_seq_lengths"])))
        return attn

    def _workspace(self, key: Hashable, args: tuple, kwargs: dict,
                   host_lists: dict[str, Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Graph ``key``'s shared workspace (grown when a task needs more: the tasks
        captured before keep the one they were given) and lse placeholder."""
        needed = self.fia_workspace(*args, **kwargs, **host_lists)
        shared = self.workspaces.get(key)
        if shared is None or shared[0].numel() < needed.numel():
            # softmax_lse_flag=False: the lse output is a placeholder
            shared = self.workspaces[key] = (needed, args[0].new_empty(1))
        return shared

    def check(self, key: Hashable, host_lists: dict[str, Sequence[int]]) -> list[FiaTask]:
        """The tasks of graph ``key``, after checking this step's lists fit them."""
        tasks = self.tasks.get(key, [])
        if tasks:
            _check_lists(host_lists)
            n = len(host_lists["actual_seq_lengths"])
            if n != tasks[0].num_reqs:
                raise BatchMetadataError(
                    f"FIA graph update for graph {key}: {n} requests in this step's host "
                    f"lists, {tasks[0].num_reqs} at capture (the runner must pad the batch "
                    "to the captured size)")
        return tasks

    def update(self, key: Hashable, host_lists: dict[str, Sequence[int]]) -> int:
        """Re-issue every task of graph ``key`` with this step's host lists; call once
        before each replay of that graph. Returns how many tasks were updated."""
        tasks = self.check(key, host_lists)
        if not tasks:
            return 0
        if self._stream is None:
            self._stream = self.device.Stream()
        stream = self._stream
        # After everything already queued (the previous replay of this graph among it):
        # a task is never re-parameterized under a replay still running it.
        stream.wait_stream(self.device.current_stream())
        with self.device.stream(stream):
            for task in tasks:
                self.device.graph_task_update_begin(stream, task.handle)
                try:
                    self.fia_out(*task.args, **task.kwargs, **host_lists)
                finally:   # a refused call never leaves the stream in update mode
                    self.device.graph_task_update_end(stream)
                task.event.record(stream)
        return len(tasks)

    def clear(self) -> None:
        self.tasks.clear()
        self.workspaces.clear()


def weak_ref(tensor):
    """A tensor on the same memory that does not keep it allocated (vLLM's
    ``_C.weak_ref_tensor``, torch_npu's on an NPU; on the CPU stand-in an alias, since a
    CPU tensor cannot be weakly referenced); the tensor itself where none is defined."""
    if not isinstance(tensor, torch.Tensor) or not hasattr(torch.ops._C, "weak_ref_tensor"):
        return tensor
    return torch.ops._C.weak_ref_tensor(tensor)


def _check_lists(host_lists: dict[str, Sequence[int]]) -> None:
    if set(host_lists) != set(HOST_LISTS):
        raise BatchMetadataError(
            f"FIA graph task host lists: got {sorted(host_lists)}, expected {list(HOST_LISTS)}")
    q, kv = host_lists["actual_seq_lengths"], host_lists["actual_seq_lengths_kv"]
    if len(q) != len(kv):
        raise BatchMetadataError(
            f"FIA graph task host lists: {len(q)} query ends but {len(kv)} kv lengths")


def for_device(vllm_config, device) -> FiaGraphTasks | None:
    """The builder's graph tasks where decode graphs are captured: FIA's ``.out`` form and
    workspace query as this process's device runtime registered them
    (``worker/npu_device.py``: torch_npu's on an NPU, the references on the emulated
    platform's stand-in); else None (eager steps call FIA directly)."""
    if device is None or vllm_config is None:
        return None
    mode = vllm_config.compilation_config.cudagraph_mode
    if mode is None or not mode.has_full_cudagraphs():
        return None
    from vllm_ascend_ext.worker import npu_device

    runtime = npu_device.current_runtime()
    out = npu_device.runtime_kernel(npu_device.FIA_OUT)
    workspace = npu_device.runtime_kernel(npu_device.FIA_WORKSPACE)
    if runtime is None or out is None or workspace is None:
        return None
    return FiaGraphTasks(runtime, out, workspace)


def fia_call(tasks: FiaGraphTasks | None, args: tuple, kwargs: dict,
             host_lists: dict[str, Sequence[int]], default_key: Hashable,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """One FIA call of a layer's forward; returns its attention output. While a decode
    graph is being captured it becomes an updatable task of that graph (keyed by
    ``graph_key(default_key)``) writing into ``out`` (the layer's output rows, when
    contiguous); otherwise FIA runs with these host lists."""
    if tasks is not None and tasks.capturing():
        if out is not None and not out.is_contiguous():
            out = None
        return tasks.capture(graph_key(default_key), args, kwargs, host_lists, out)
    attn, _ = npu_fused_infer_attention_score(*args, **kwargs, **host_lists)
    return attn


def graph_key(default: Hashable) -> Hashable:
    """The key of the graph being captured: vLLM's batch descriptor when a forward
    context is set (the engine), else ``default`` (standalone use)."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if is_forward_context_available():
        descriptor = get_forward_context().batch_descriptor
        if descriptor is not None:
            return descriptor
    return default


def _step_lists(attn_metadata):
    """(graph tasks, host lists) of each FIA metadata group of a step, once per group."""
    metadatas = attn_metadata.values() if isinstance(attn_metadata, dict) else ()
    seen: set[int] = set()
    for md in metadatas:
        tasks = getattr(md, "graph_tasks", None)
        if tasks is None or id(tasks) in seen:
            continue
        seen.add(id(tasks))
        if len(md.spans) > 1:   # a graph step is one FIA call: one span
            raise BatchMetadataError("a split (mixed) step was replayed as a decode graph")
        yield tasks, {"actual_seq_lengths": md.actual_seq_lengths_q,
                      "actual_seq_lengths_kv": md.actual_seq_lengths_kv}


def update_before_replay(attn_metadata, key: Hashable) -> int:
    """Before graph ``key`` replays: check every group's lists first (nothing is issued
    if one does not fit), then update every FIA task of that graph with this step's
    host lists (``attn_metadata``: the forward context's, layer name -> metadata), the
    runner's padding requests given the graph's extra tokens (``plan.pad_to_graph``).
    Returns how many tasks were updated."""
    num_tokens = getattr(key, "num_tokens", key if isinstance(key, int) else None)
    groups = []
    for tasks, lists in _step_lists(attn_metadata or {}):
        if num_tokens is not None and lists["actual_seq_lengths"]:
            q, kv = pad_to_graph(lists["actual_seq_lengths"], lists["actual_seq_lengths_kv"],
                                 num_tokens)
            lists = {"actual_seq_lengths": q, "actual_seq_lengths_kv": kv}
        groups.append((tasks, lists))
    for tasks, lists in groups:
        tasks.check(key, lists)
    return sum(tasks.update(key, lists) for tasks, lists in groups)
