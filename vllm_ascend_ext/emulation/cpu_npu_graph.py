"""Graphs with NPU semantics on the CPU stand-in device (``emulation/cpu_npu.py``).

An aclgraph (like a CUDA graph) records the kernels a capture launches, on the buffers
they read and write, and replays them; host values (Python ints and lists passed to an
operator, tensors made from them) are frozen at capture. The only way to change a
captured operator's host arguments is torch_npu's graph-task update, which re-issues one
task of the graph with new arguments (``attention/fia/graph_tasks.py``).

``CpuGraph`` does the same at the dispatcher: capture records every operator call
(``TorchDispatchMode``) with its argument tensors and its outputs; replay re-runs the
calls in order on the same tensors, writing each functional call's result into the
tensor it produced at capture. Tensors made from host values during capture are
constants of the graph; buffers written outside the graph (the runner's inputs, the
builders' persistent block tables) are read as they are at replay. A capture that reads
a device value on the host (``.item()``, ``bool(t)``, a data-dependent shape) raises, as
a capturing NPU stream does; ``.tolist()``, ``.cpu()`` and ``.numpy()`` of a CPU tensor
never reach the dispatcher, so those stay invisible here. A group of calls bracketed by
``graph_task_group_begin/end`` is a task: ``graph_task_update_begin(handle)`` ..
``update_end`` replaces its calls with the ones issued in between. An NPU operator
called through ``ops/_dispatch.pick`` is one recorded kernel (``as_kernel``, which the
stand-in runtime installs into the dispatch when it is brought up: ``install``): its
Python reference re-runs whole at replay, with the Python arguments of its capture. An
update re-issues a task without running it, as torch_npu's does: its NPU operators run
their shape-only implementation there (the operator's argument checks, outputs without
data) and compute at the next replay.

Compiled code must dispatch its operators for capture to see them: the emulated
platform compiles with Dynamo's eager backend when it captures graphs.
"""

from __future__ import annotations

import contextvars
import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten

from vllm_ascend_ext.ops import _dispatch, counting

aten = torch.ops.aten


class GraphCaptureError(RuntimeError):
    """An operation a captured graph cannot contain (a host read of device data)."""


# Operators that read device data on the host (a sync on an NPU, refused in capture).
HOST_READS = {
    aten._local_scalar_dense.default, aten.is_nonzero.default, aten.equal.default,
    aten.nonzero.default, aten.masked_select.default, aten._unique2.default,
    aten.unique_consecutive.default, aten.unique_dim.default,
}
# Allocations without data: nothing to re-run.
NO_DATA = {
    aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default,
    aten.new_empty.default, aten.new_empty_strided.default,
}


# vLLM's (and the plugin's) opaque Python custom ops: not kernels but Python that issues
# kernels. Capture runs their Python with the recorder on, so the graph holds the
# kernels they issue (on an NPU those are what the graph captures), never the op itself.
# vLLM's, by "module:function"; the plugin's own are its layer entry ops, declared by
# their owners where they register them (``ops/counting.layer_entry``).
PYTHON_OPS = {
    "vllm::unified_attention_with_output":
        "vllm.model_executor.layers.attention.attention:unified_attention_with_output",
    "vllm::unified_kv_cache_update":
        "vllm.model_executor.layers.attention.attention:unified_kv_cache_update",
    "vllm::moe_forward": "vllm.model_executor.layers.fused_moe.runner.moe_runner:_moe_forward",
    "vllm::moe_forward_shared":
        "vllm.model_executor.layers.fused_moe.runner.moe_runner:_moe_forward_shared",
    # sequence-parallel MoE (DP x TP with EP): each TP rank's slice of the tokens
    "vllm::sequence_parallel_chunk_impl":
        "vllm.model_executor.models.utils:sequence_parallel_chunk_impl",
}
# Namespaces whose ops are Python custom ops (an unknown one is refused, not recorded).
PYTHON_NAMESPACES = ("vllm", "ascend_ext")


@functools.cache
def import_body(target: str) -> Callable[..., Any]:
    """``"module:function"`` -> the function (a custom op's Python body)."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def python_op(func):
    """The Python implementation of an opaque custom op, None for a kernel; raises for
    an unknown op of a Python-op namespace."""
    name = func._schema.name
    if name.split("::")[0] not in PYTHON_NAMESPACES:
        return None
    target = PYTHON_OPS.get(name)
    if target is not None:
        return import_body(target)
    body = counting.layer_entry_body(name)
    if body is None:
        raise GraphCaptureError(
            f"{name}: a Python custom op the CPU stand-in cannot capture through (vLLM's: "
            "add it to emulation/cpu_npu_graph.py PYTHON_OPS; the plugin's: declare it with "
            "ops/counting.layer_entry where it is registered)")
    return body


@dataclass
class _Call:
    func: Any
    args: tuple
    kwargs: dict
    copy_into: list          # the capture's output tensors, refilled on replay (functional)
    inputs: frozenset = frozenset()   # kernel calls: input storages (aliasing outputs skipped)
    collective: bool = False          # a process-group collective (``is_collective``)
    deferred: bool = False            # issued by an update: ``copy_into`` came from its meta


@dataclass
class TaskHandle:
    """One updatable task of a graph (``graph_task_group_end``'s handle)."""
    calls: list = field(default_factory=list)
    updates: int = 0

    def begin_update(self) -> _Recorder:
        """Record the calls that will replace this task's (``graph_task_update_begin``)."""
        recorder = _Recorder([], "a graph-task update", defers_kernels=True)
        recorder.__enter__()
        return recorder

    def end_update(self, recorder: _Recorder) -> None:
        recorder.__exit__(None, None, None)
        self.calls = recorder.sink
        self.updates += 1


@dataclass
class EventWait:
    """A captured wait on an ExternalEvent: the replay goes on only once it was recorded."""
    event: object

    def run(self) -> None:
        if not self.event.recorded:
            raise GraphCaptureError(
                "replay waits on an ExternalEvent no graph-task update recorded (on an NPU "
                "the replay would wait forever): update the graph's tasks before replaying")


@dataclass
class EventReset:
    event: object

    def run(self) -> None:
        self.event.recorded = False


COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional")


# Operators of those namespaces that exchange nothing (a wait on a functional result).
NOT_EXCHANGES = ("_c10d_functional::wait_tensor",)


def is_collective(func) -> bool:
    """A process-group collective (what HCCL records into an aclgraph on an NPU)."""
    schema = getattr(func, "_schema", None)
    return (schema is not None and schema.name.split("::")[0] in COLLECTIVE_NAMESPACES
            and schema.name not in NOT_EXCHANGES)


def _run_collective(func, args, kwargs):
    """One collective, unrecorded inside (gloo finishes some with copies of its own, on
    the caller's thread, when waited), complete before the next call reads its buffers,
    as the captured HCCL task is on the NPU's stream: its ``Work`` is waited here, and a
    functional collective's result (whose wait Dynamo issued as ``wait_tensor``, an alias
    the graph does not record) is waited on."""
    with _disable_current_modes():
        result = func(*args, **kwargs)
        for item in tree_flatten(result)[0]:
            if isinstance(item, torch.ScriptObject):    # c10d's Work, as the dispatcher returns it
                dist.Work.unbox(item).wait()
            elif isinstance(item, torch.Tensor):
                torch.ops._c10d_functional.wait_tensor(item)
    return result


def _completed(result):
    """``result`` with each c10d ``Work`` replaced by one already complete: the caller's
    own wait then issues nothing (gloo's wait would repeat its closing copies, outside
    the recorded collective)."""
    if isinstance(result, torch.ScriptObject):
        done = torch.futures.Future()
        done.set_result([])
        return torch._C._distributed_c10d._create_work_from_future(done).boxed()
    if isinstance(result, (tuple, list)):
        return type(result)(_completed(r) for r in result)
    return result


def _writes(func) -> bool:
    """Whether the op mutates an argument (in place, ``out=``), from its schema."""
    return any(a.alias_info is not None and a.alias_info.is_write
               for a in func._schema.arguments)


def _storages(tree) -> set:
    """The storages of the tensors in ``tree`` (an operator's arguments or results)."""
    return {t.untyped_storage().data_ptr() for t in _tensors(tree) if t.device.type != "meta"}


def _has_bool_index(func, args) -> bool:
    if func is not aten.index.Tensor or len(args) < 2:
        return False
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] or ())


# The recorders of the stand-in captures or updates in progress, innermost last (a
# recorder re-enters itself around a Python custom op's body).
_ACTIVE: list = []


def install() -> None:
    """Make every NPU operator call through ``ops/_dispatch.pick`` go through ``as_kernel``
    (done when the stand-in runtime is brought up, before any operator runs in its
    process; idempotent)."""
    _dispatch.install_kernel_wrapper(as_kernel)


def as_kernel(impl, meta=None):
    """An NPU operator's implementation as called by the plugin (``ops/_dispatch.pick``):
    while a stand-in graph is being captured or updated, one call is recorded as one
    kernel (its Python reference runs unrecorded, and again, whole, at every replay),
    as the NPU records the torch_npu kernel; otherwise ``impl`` itself. In an update the
    call runs ``meta`` (its checks, outputs without data) instead: the kernel computes at
    replay."""
    if not _ACTIVE:
        return impl
    return functools.partial(_kernel_call, _ACTIVE[-1], impl, meta)


def _kernel_call(recorder, impl, meta, *args, **kwargs):
    deferred = recorder.defers_kernels and meta is not None
    with _disable_current_modes():
        if deferred:
            out = meta(*args, **kwargs)   # None: an operator that only writes its arguments
            if any(t.device.type == "meta" for t in _tensors(out)):
                deferred = False   # a meta on the meta device: no buffers to refill, run it
        if not deferred:
            out = impl(*args, **kwargs)
    inputs = frozenset(_storages((args, kwargs)))
    # outputs that are (views of) its inputs are rewritten by the re-run itself
    declared = tuple((var, var.get()) for var in kernel_context())
    recorder.sink.append(_Call(_InContext(impl, declared), args, kwargs,
                               _fresh(out, inputs), inputs, deferred=deferred))
    return out


@functools.cache
def kernel_context() -> tuple:
    """The context variables the plugin declares around operator calls and its references
    read: expert parallelism's ``groups_may_end_early`` (``ops/grouped_matmul.py``)."""
    from vllm_ascend_ext.ops.grouped_matmul import KERNEL_CONTEXT

    return KERNEL_CONTEXT


@dataclass
class _InContext:
    """A kernel's reference re-run with the declarations the plugin made around its call
    at capture (``kernel_context``): on an NPU they are part of the kernel the graph
    recorded, not of the replay's caller."""
    impl: Callable[..., Any]
    declared: tuple

    def __call__(self, *args, **kwargs):
        if all(var.get() is value for var, value in self.declared):
            return self.impl(*args, **kwargs)   # the replay's context already declares them
        return contextvars.copy_context().run(self._run, args, kwargs)

    def _run(self, args, kwargs):
        for var, value in self.declared:
            var.set(value)
        return self.impl(*args, **kwargs)


def _tensors(tree) -> list:
    """The tensors of ``tree`` (nested tuples, lists and dicts), in order."""
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        tree = tuple(tree.values())
    if not isinstance(tree, (tuple, list)):
        return []
    found = []
    for item in tree:
        found.extend(_tensors(item))
    return found


def _fresh(out, inputs) -> list:
    return [t for t in _tensors(out) if t.untyped_storage().data_ptr() not in inputs]


def _check_deferred(call, into, fresh) -> None:
    """A task issued by an update refills the outputs its operator's meta gave: the
    kernel's must match them (else the replay would cast or drop them silently)."""
    if len(into) != len(fresh) or any(
            d.shape != s.shape or d.dtype != s.dtype for d, s in zip(into, fresh)):
        raise GraphCaptureError(
            f"{getattr(call.func, 'impl', call.func)}: its meta gave outputs "
            f"{[(tuple(t.shape), t.dtype) for t in into]}, its kernel "
            f"{[(tuple(t.shape), t.dtype) for t in fresh]} (an update issues the task with "
            "the meta's outputs)")


class _Recorder(TorchDispatchMode):
    """Runs every call as usual and appends it to ``sink`` (a list)."""

    def __init__(self, sink: list, what: str, defers_kernels: bool = False):
        super().__init__()
        self.sink = sink
        self.what = what
        self.defers_kernels = defers_kernels   # an update: NPU operators run at replay

    def __enter__(self):
        _ACTIVE.append(self)
        return super().__enter__()

    def __exit__(self, *exc):
        _ACTIVE.pop()
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in HOST_READS or _has_bool_index(func, args):
            raise GraphCaptureError(
                f"{func} reads device data on the host during {self.what}; an NPU graph "
                "cannot contain a host read (operation not permitted while the stream is "
                "capturing)")
        impl = python_op(func)
        if impl is not None:
            with self:   # the op's Python, its kernels recorded
                return impl(*args, **kwargs)
        if is_collective(func):
            return self._collective(func, args, kwargs)
        out = func(*args, **kwargs)
        if func in NO_DATA:
            return out
        writes, inputs = _writes(func), frozenset(_storages((args, kwargs)))
        if not writes and not _tensors(out):
            return out   # host values only (``sym_size``): nothing for the device to re-run
        if not writes and _storages(out) & inputs:
            # a view, or an op that returned its input (``to`` to the same dtype,
            # weak_ref_tensor): aliases what the graph already has
            return out
        # results the re-run writes itself (in place, out=) are skipped; a new tensor an
        # op returns beside the arguments it writes is refilled like a functional result
        inputs = inputs if writes else frozenset()
        self.sink.append(_Call(func, args, kwargs, _fresh(out, inputs), inputs))
        return out

    def _collective(self, func, args, kwargs):
        """One collective, one recorded kernel (an HCCL task in an aclgraph): it completes
        here (``_run_collective``), and its output arguments, which c10d's schemas do not
        mark as written, are rewritten by its re-run at replay."""
        out = _run_collective(func, args, kwargs)
        inputs = frozenset(_storages((args, kwargs)))
        self.sink.append(_Call(func, args, kwargs, _fresh(out, inputs), inputs, collective=True))
        return _completed(out)


class CpuGraph:
    """``torch.npu.NPUGraph`` on the CPU stand-in (see module docstring)."""

    def __init__(self, runtime):
        self._runtime = runtime
        self._items: list = []          # _Call or TaskHandle, in issue order
        self._recorder: _Recorder | None = None
        self.replays = 0

    # capture ---------------------------------------------------------------------------
    def capture_begin(self, pool=None, capture_error_mode: str = "global") -> None:
        if self._recorder is not None:
            raise GraphCaptureError("capture_begin on a graph already capturing")
        self._items = []
        self._recorder = _Recorder(self._items, "graph capture")
        self._runtime._begin_capture(self)
        self._recorder.__enter__()

    def capture_end(self) -> None:
        recorder, self._recorder = self._recorder, None
        recorder.__exit__(None, None, None)
        self._runtime._end_capture(self)

    def _add_step(self, step) -> None:
        self._recorder.sink.append(step)

    def _open_task(self) -> TaskHandle:
        task = TaskHandle()
        self._items.append(task)
        self._recorder.sink = task.calls
        return task

    def _close_task(self) -> None:
        self._recorder.sink = self._items

    # replay ----------------------------------------------------------------------------
    def replay(self) -> None:
        if self._recorder is not None:
            raise GraphCaptureError("replay of a graph still capturing")
        for item in self._items:
            if isinstance(item, (EventWait, EventReset)):
                item.run()
                continue
            for call in (item.calls if isinstance(item, TaskHandle) else (item,)):
                if call.collective:
                    result = _run_collective(call.func, call.args, call.kwargs)
                else:
                    result = call.func(*call.args, **call.kwargs)
                into = call.copy_into
                if not into:
                    continue
                if len(into) == 1 and not call.inputs and isinstance(result, torch.Tensor):
                    into[0].copy_(result)   # a functional op's one result
                else:
                    fresh = _fresh(result, call.inputs)
                    if call.deferred:
                        _check_deferred(call, into, fresh)
                    for dst, src in zip(into, fresh):
                        dst.copy_(src)
        self.replays += 1

    def reset(self) -> None:
        self._items = []

    def pool(self):
        return None

    def num_calls(self) -> int:
        return sum(len(i.calls) if isinstance(i, TaskHandle) else isinstance(i, _Call)
                   for i in self._items)

    def collectives(self) -> list[str]:
        """The recorded collective calls (``c10d`` / ``_c10d_functional`` operators), by
        operator name, in issue order."""
        return [c.func._schema.name for c in self._calls() if is_collective(c.func)]

    def _calls(self):
        for item in self._items:
            if isinstance(item, TaskHandle):
                yield from item.calls
            elif isinstance(item, _Call):
                yield item

    def tasks(self) -> list[TaskHandle]:
        return [i for i in self._items if isinstance(i, TaskHandle)]

