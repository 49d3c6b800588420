"""A CPU stand-in of the NPU device runtime: the ``torch.npu`` surface the NPU worker,
the NPU model runner and the FIA graph tasks reach, for the emulated platform.

The emulated platform runs the plugin's NPU worker and runner (``worker/npu_worker.py``,
``worker/npu_model_runner.py``) with this module in the place of ``torch.npu``; nothing
else of the NPU path changes. What it models:

* **streams and events**: synchronous (every operator has finished when it returns), so
  waits, records and synchronizes are orderings that already hold; the current stream
  is tracked as on a device.
* **graphs with NPU semantics**: ``NPUGraph`` is ``CpuGraph`` (``emulation/cpu_npu_graph.py``):
  capture records the dispatched operator calls on their buffers, replay re-issues
  them with host values frozen at capture, and the graph-task API
  (``graph_task_group_begin/end``, ``graph_task_update_begin/end``) updates one task.
* **memory**: a device as large as the host memory available when it was brought up
  (empty then, as a fresh NPU is); "allocated/reserved" is the process's resident growth
  since then, free the rest, the peak the largest value seen since the last reset. It feeds the
  worker's memory snapshot and ``torch.accelerator``'s statistics; the emulated KV
  budget itself is chosen before the engine starts (``emulation/kv_budget.py``).

``install`` points ``torch.accelerator``'s device functions and ``torch.Event`` (which the
GPU runner uses directly, and which a CPU build cannot record) at the stand-in, in the
emulated worker's process only. Never imported on an NPU.
"""

from __future__ import annotations

import contextlib
import os
import types

import psutil
import torch

from vllm_ascend_ext.emulation import cpu_npu_graph
from vllm_ascend_ext.emulation.cpu_npu_graph import CpuGraph, GraphCaptureError
from vllm_ascend_ext.ops import _ext
from vllm_ascend_ext.platform.npu import AscendNPUPlatform

NAME = "cpu-npu-stand-in"
# Devices the stand-in reports: an Atlas 800 A2 node's eight NPUs, so the ranks of one
# emulated node (tensor / data parallel) each find "their" device; all of them are the CPU.
STAND_IN_DEVICES = 8
# As the NPU runtime, a process sees only the devices this variable lists, when it is set
# (Ray's NPU accelerator sets it per actor unless told not to; see platform/npu.py).
VISIBLE_ENV = AscendNPUPlatform.device_control_env_var


def visible_device_count(environ=os.environ) -> int:
    """The devices the process sees: the stand-in node's eight, or as many as
    ``ASCEND_RT_VISIBLE_DEVICES`` lists (those of the eight that exist)."""
    listed = environ.get(VISIBLE_ENV)
    if listed is None or not listed.strip():
        return STAND_IN_DEVICES
    ids = [x.strip() for x in listed.split(",") if x.strip()]
    return sum(1 for x in ids if x.isdigit() and int(x) < STAND_IN_DEVICES)


class Stream:
    """A synchronous stream: everything issued on it has completed."""

    def __init__(self, device=None, priority: int = 0, **kwargs) -> None:
        self.device = torch.device("cpu")
        self.priority = priority

    def wait_stream(self, other) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class Event:
    """A synchronous event (torch.npu.Event's keywords; CUDA's ``blocking`` accepted)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False, **kwargs) -> None:
        self.recorded = False

    def record(self, stream=None) -> None:
        self.recorded = True

    def wait(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end) -> float:
        return 0.0


class ExternalEvent(Event):
    """torch_npu's ``ExternalEvent``: graph tasks wait on it. Waited on and reset inside a
    capture, the wait and the reset are steps of the graph (``EventWait``/``EventReset``):
    a replay whose event no update recorded would wait forever on an NPU; here it raises."""

    def __init__(self, state: dict | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self._state = state or {}

    def _graph(self):
        return self._state.get("capturing")

    def wait(self, stream=None) -> None:
        if self._graph() is not None:
            self._graph()._add_step(cpu_npu_graph.EventWait(self))

    def reset(self, stream=None) -> None:
        if self._graph() is not None:
            self._graph()._add_step(cpu_npu_graph.EventReset(self))
        else:
            self.recorded = False


class Memory:
    """The stand-in's memory model (see module docstring)."""

    def __init__(self) -> None:
        self._process = psutil.Process()
        self._base = self._rss()
        self._total = psutil.virtual_memory().available
        self._peak = 0

    def _rss(self) -> int:
        return self._process.memory_info().rss

    def allocated(self) -> int:
        now = max(0, self._rss() - self._base)
        self._peak = max(self._peak, now)
        return now

    def peak(self) -> int:
        self.allocated()
        return self._peak

    def reset_peak(self) -> None:
        self._peak = self.allocated()

    def info(self) -> tuple[int, int]:
        return max(0, self._total - self.allocated()), self._total

    def stats(self) -> dict[str, int]:
        now = self.allocated()
        return {"allocated_bytes.all.current": now, "allocated_bytes.all.peak": self._peak,
                "reserved_bytes.all.current": now, "reserved_bytes.all.peak": self._peak,
                "num_alloc_retries": 0, "num_ooms": 0}


class OffsetGenerator(torch.Generator):
    """A CPU generator with an NPU generator's offset, as far as the runner uses it.

    NPU generators (Philox) have an offset; CPU ones (Mersenne Twister) have none, and
    stock vLLM on a CPU fails where its runner rewinds a discarded partial prefill's draw.
    Here ``get_offset()`` keeps the generator's state under a new offset (4 past the last
    one) and ``set_offset(k)`` restores the state kept under ``k``: the NPU runner reads
    the offsets before sampling and vLLM's ``get_offset() - 4`` names that same reading,
    so both rewinds land on the state before the step's draws. An offset never read is
    refused: the stand-in models no more than the runner uses."""

    STEP = 4
    KEPT = 8

    def __new__(cls, source: torch.Generator):
        return super().__new__(cls, device="cpu")

    def __init__(self, source: torch.Generator) -> None:
        self.set_state(source.get_state())
        self._offset = 0
        self._states: dict[int, torch.Tensor] = {}

    def get_offset(self) -> int:
        self._offset += self.STEP
        self._states[self._offset] = self.get_state()
        for old in [k for k in self._states if k <= self._offset - self.STEP * self.KEPT]:
            del self._states[old]
        return self._offset

    def set_offset(self, offset: int) -> OffsetGenerator:
        if offset not in self._states:
            raise RuntimeError(
                f"the stand-in's generator restores offsets it was read at only "
                f"(asked {offset}, read: {sorted(self._states)})")
        self.set_state(self._states[offset])
        return self


def offset_generators(generators: dict, requests: dict, req_ids: list) -> None:
    """Before a sampling step: the batch's seeded generators as ``OffsetGenerator`` (the
    request's own record too, so a resumed request keeps it)."""
    for index, gen in list(generators.items()):
        if not isinstance(gen, OffsetGenerator):
            gen = generators[index] = OffsetGenerator(gen)
            state = requests.get(req_ids[index]) if index < len(req_ids) else None
            if state is not None:
                state.generator = gen


def make_runtime() -> types.ModuleType:
    """A fresh stand-in ``torch.npu`` (one per worker process). Bringing it up installs
    its graph recorder's kernel wrapper into the operators' dispatch
    (``cpu_npu_graph.install``) and loads the compiled emulation kernels (which a compiled
    model's trace then takes: ``ops/compiled.emulation_kernel``), before any operator of
    the process runs on it."""
    cpu_npu_graph.install()
    _ext.load()
    rt = types.ModuleType("torch_npu_cpu_stand_in")
    rt.__stand_in__ = NAME
    memory = Memory()
    default = Stream()
    state = {"stream": default, "capturing": None, "update": None}
    rt.ExternalEvent = lambda: ExternalEvent(state)

    rt.Stream, rt.Event = Stream, Event
    rt.device_count = visible_device_count
    rt.current_device = lambda: 0
    rt.set_device = lambda device: None
    rt.synchronize = lambda device=None: None
    rt.empty_cache = lambda: None
    rt.empty_host_cache = lambda: None
    rt.is_available = lambda: True
    rt.get_device_name = lambda device=None: "Ascend stand-in (CPU)"
    rt.current_stream = lambda device=None: state["stream"]
    rt.default_stream = lambda device=None: default

    def set_stream(stream) -> None:
        state["stream"] = stream if stream is not None else default

    @contextlib.contextmanager
    def stream(s):
        previous = state["stream"]
        set_stream(s if s is not None else previous)
        try:
            yield
        finally:
            set_stream(previous)

    rt.set_stream, rt.stream = set_stream, stream

    # graphs
    def begin_capture(graph) -> None:
        if state["capturing"] is not None:
            raise GraphCaptureError("a graph is already being captured")
        state["capturing"] = graph

    def end_capture(graph) -> None:
        state["capturing"] = None

    rt._begin_capture, rt._end_capture = begin_capture, end_capture
    rt.NPUGraph = lambda *args, **kwargs: CpuGraph(rt)
    rt.graph_pool_handle = lambda: (0, 0)
    rt.is_current_stream_capturing = lambda: state["capturing"] is not None

    @contextlib.contextmanager
    def graph(npu_graph, pool=None, stream=None, capture_error_mode: str = "global"):
        with rt.stream(stream):
            npu_graph.capture_begin(pool)
            try:
                yield npu_graph
            finally:
                npu_graph.capture_end()

    rt.graph = graph

    def graph_task_group_begin(stream) -> None:
        if state["capturing"] is None:
            raise GraphCaptureError("graph_task_group_begin outside a graph capture")
        state["task"] = state["capturing"]._open_task()

    def graph_task_group_end(stream):
        state["capturing"]._close_task()
        return state.pop("task")

    def graph_task_update_begin(stream, handle) -> None:
        if state["capturing"] is not None or state["update"] is not None:
            raise GraphCaptureError("graph_task_update_begin inside a capture or an update")
        state["update"] = (handle, handle.begin_update())

    def graph_task_update_end(stream) -> None:
        handle, recorder = state["update"]
        state["update"] = None
        handle.end_update(recorder)

    rt.graph_task_group_begin, rt.graph_task_group_end = (graph_task_group_begin,
                                                          graph_task_group_end)
    rt.graph_task_update_begin, rt.graph_task_update_end = (graph_task_update_begin,
                                                            graph_task_update_end)

    # memory (torch.npu's names)
    rt.mem_get_info = lambda device=None: memory.info()
    rt.memory_stats = lambda device=None: memory.stats()
    rt.memory_allocated = lambda device=None: memory.allocated()
    rt.memory_reserved = lambda device=None: memory.allocated()
    rt.max_memory_allocated = lambda device=None: memory.peak()
    rt.reset_peak_memory_stats = lambda device=None: memory.reset_peak()
    return rt


# torch.accelerator name -> the runtime's function serving it.
ACCELERATOR = {
    "synchronize": "synchronize",
    "empty_cache": "empty_cache",
    "empty_host_cache": "empty_host_cache",
    "device_count": "device_count",
    "current_device_index": "current_device",
    "set_device_index": "set_device",
    "memory_stats": "memory_stats",
    "memory_allocated": "memory_allocated",
    "memory_reserved": "memory_reserved",
    "max_memory_allocated": "max_memory_allocated",
    "reset_peak_memory_stats": "reset_peak_memory_stats",
    "get_memory_info": "mem_get_info",
}


HOST_ONLY_NOOPS = ("empty_cache", "empty_host_cache", "synchronize")


def quiet_host_accelerator() -> list[str]:
    """A process of the emulated engine that brings up no stand-in (the engine core beside
    multiprocess workers) still runs vLLM's non-CPU clean-up, which calls
    ``torch.accelerator``'s cache functions; a CPU build raises there ("Cannot access
    accelerator device"). Those become no-ops (the stand-in's own, which ``install``
    replaces if this process brings one up later). Returns the names replaced."""
    if torch.accelerator.current_accelerator() is not None:
        return []
    done = []
    for name in HOST_ONLY_NOOPS:
        if hasattr(torch.accelerator, name):
            setattr(torch.accelerator, name, lambda *a, **k: None)
            done.append(name)
    return done


def install(rt: types.ModuleType) -> dict:
    """Route ``torch.accelerator``'s device functions and ``torch.Event`` to ``rt`` (the
    emulated worker's process). Returns ``{name: what it replaced}``."""
    replaced = {}
    for name, target in ACCELERATOR.items():
        replaced[f"accelerator.{name}"] = getattr(torch.accelerator, name, None)
        # a distinct function per name: Dynamo keys handlers on the function object
        fn = getattr(rt, target)
        setattr(torch.accelerator, name, lambda *a, _fn=fn, **k: _fn(*a, **k))
    replaced["Event"] = torch.Event
    torch.Event = rt.Event
    return replaced
