"""Operator counts at the dispatcher level, with the plugin's NPU operators opaque.

``OpCounter`` is a ``TorchDispatchMode``: every ATen operator that reaches the
dispatcher while it is active is counted once under its packet name
(``aten.mm``). Each plugin operator (functions decorated with ``npu_op``) is
counted once under its torch_npu name (``npu_mla_prolog_v3``) and the ATen
operators its reference runs internally are *not* counted: on an NPU that call is
one kernel launch. View operators (no kernel on any device) are counted apart,
under ``views``.

Dtype conversions are recorded with their direction, e.g.
``aten._to_copy[torch.int64->torch.int32]``, so a test can ask how many slot-index
casts a step makes.

Counts are bucketed by step: ``OpCounter(steps_of=Builder)`` opens a new bucket each
time ``Builder.build`` returns (labelled with the metadata's ``kind``), by wrapping
that method while the counter is active; ``new_step`` opens one by hand.

The plugin's own *layer entry ops* (opaque custom ops wrapping a layer's Python, e.g.
``ascend_ext.sfa_forward``) are entered rather than counted: what runs inside them is
counted, and also tallied under the entry's region (attention layers or MoE). Each owner
declares its entry where it registers the custom op (``layer_entry``), so this module
names none of them; the emulated graph recorder (``emulation/cpu_npu_graph.py``) looks
the bodies up here too. Production code knows nothing of this module beyond the
``npu_op`` name tag and those declarations; with no counter active the tag costs one
list check.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_ACTIVE: list[OpCounter] = []
# Bookkeeping, not kernels.
IGNORED_NAMESPACES = ("profiler",)
# Which per-step tally a layer entry's body also goes to (StepCounts.in_layers / in_moe).
ATTENTION_REGION, MOE_REGION = "attention", "moe"
REGIONS = (ATTENTION_REGION, MOE_REGION)


@dataclass(frozen=True)
class LayerEntry:
    """A custom op wrapping a layer's Python: counted (and graph-captured) through its body."""
    name: str                       # the op's packet name, ``namespace.op`` (ascend_ext.sfa_forward)
    body: Callable[..., Any]        # the Python the op runs (what the counter enters)
    region: str                     # ATTENTION_REGION or MOE_REGION


class LayerEntryConflict(RuntimeError):
    """Two declarations give one layer entry op different bodies or regions."""


# The layer entry ops declared in this process: packet name -> its declaration. Filled by
# the owners when they register their custom ops (which is before the op can run).
LAYER_ENTRIES: dict[str, LayerEntry] = {}


def layer_entry(name: str, body: Callable[..., Any], region: str) -> LayerEntry:
    """Declare the custom op ``name`` (``namespace.op``) a layer entry running ``body``:
    the op counter counts what ``body`` runs instead of the op, under ``region`` too, and
    the emulated graph capture records the kernels ``body`` issues. Called by the owner
    where it registers the op; declaring the same entry again is a no-op."""
    if region not in REGIONS:
        raise ValueError(f"{name}: region {region!r} is not one of {REGIONS}")
    entry = LayerEntry(name, body, region)
    if LAYER_ENTRIES.setdefault(name, entry) != entry:
        raise LayerEntryConflict(f"{name}: declared as {LAYER_ENTRIES[name]}, now as {entry}")
    return entry


def layer_entry_body(name: str) -> Callable[..., Any] | None:
    """The Python body of the layer entry op ``name`` (``namespace.op`` or
    ``namespace::op``), None when no layer entry of that name is declared."""
    entry = LAYER_ENTRIES.get(name.replace("::", "."))
    return None if entry is None else entry.body


F = TypeVar("F", bound=Callable[..., Any])


def _is_view(func) -> bool:
    schema = func._schema
    return not schema.is_mutable and any(r.alias_info is not None for r in schema.returns)


@dataclass
class StepCounts:
    kind: str
    ops: Counter = field(default_factory=Counter)
    views: int = 0
    # The part of ``ops`` that ran inside the plugin's layer entry ops: attention layers
    # (``in_layers``) and the MoE method's routed experts on the emulated platform (``in_moe``).
    in_layers: Counter = field(default_factory=Counter)
    in_moe: Counter = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.ops.values())


class OpCounter(TorchDispatchMode):
    """``with OpCounter() as c: ...`` then ``c.steps`` (one ``StepCounts`` per step)."""

    def __init__(self, *, steps_of: type | None = None) -> None:
        super().__init__()
        self.steps: list[StepCounts] = [StepCounts("before-first-step")]
        self._steps_of = steps_of
        self._unwrap: Callable[[], None] | None = None
        self._opaque_depth = 0
        self._regions: list[str] = []
        self._watched: dict[int, str] = {}

    def watch(self, tensor: torch.Tensor, label: str) -> None:
        """Also count every operator reading ``tensor``'s storage, as ``uses[label]``."""
        self._watched[tensor.untyped_storage().data_ptr()] = label

    # -- step buckets -------------------------------------------------------
    def new_step(self, kind: str) -> None:
        self.steps.append(StepCounts(kind))

    def _bucket(self) -> StepCounts:
        return self.steps[-1]

    def total(self) -> Counter:
        out: Counter = Counter()
        for s in self.steps:
            out.update(s.ops)
        return out

    # -- counting -----------------------------------------------------------
    def _count(self, name: str) -> None:
        bucket = self._bucket()
        bucket.ops[name] += 1
        if ATTENTION_REGION in self._regions:
            bucket.in_layers[name] += 1
        if MOE_REGION in self._regions:
            bucket.in_moe[name] += 1

    def record_npu_op(self, name: str) -> None:
        if self._opaque_depth == 0:
            self._count(name)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        entry = LAYER_ENTRIES.get(str(func.overloadpacket))
        if entry is not None:
            # The plugin's own entry ops (e.g. ascend_ext.sfa_forward) are wrappers:
            # count what runs inside them (their Python body), not the wrapper.
            self._regions.append(entry.region)
            try:
                with self:
                    return entry.body(*args, **kwargs)
            finally:
                self._regions.pop()
        if self._opaque_depth == 0:
            if func.namespace in IGNORED_NAMESPACES:
                return func(*args, **kwargs)
            if _is_view(func):
                self._bucket().views += 1
            else:
                for a in args if self._watched else ():
                    if isinstance(a, torch.Tensor):
                        label = self._watched.get(a.untyped_storage().data_ptr())
                        if label is not None:
                            self._count(f"uses[{label}]")
                name = str(func.overloadpacket)
                if name == "aten._to_copy" and args and isinstance(args[0], torch.Tensor):
                    dst = kwargs.get("dtype") or args[0].dtype
                    if dst != args[0].dtype:
                        name = f"{name}[{args[0].dtype}->{dst}]"
                self._count(name)
        return func(*args, **kwargs)

    def _wrap_builder(self) -> None:
        cls, counter = self._steps_of, self
        own = "build" in cls.__dict__
        original = cls.build

        @functools.wraps(original)
        def build(builder, *args, **kwargs):
            md = original(builder, *args, **kwargs)
            counter.new_step(getattr(md, "kind", "step"))
            return md

        cls.build = build
        self._unwrap = ((lambda: setattr(cls, "build", original)) if own
                        else (lambda: delattr(cls, "build")))

    def __enter__(self):
        if self._steps_of is not None:
            self._wrap_builder()
        _ACTIVE.append(self)
        return super().__enter__()

    def __exit__(self, *exc):
        _ACTIVE.remove(self)
        if self._unwrap is not None:
            self._unwrap()
            self._unwrap = None
        return super().__exit__(*exc)


def npu_op(name: str) -> Callable[[F], F]:
    """Count calls of a plugin NPU operator once, its reference's ATen ops not at all."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            if not _ACTIVE:
                return fn(*args, **kwargs)
            for c in _ACTIVE:
                c.record_npu_op(name)
                c._opaque_depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                for c in _ACTIVE:
                    c._opaque_depth -= 1

        inner.npu_op_name = name  # type: ignore[attr-defined]
        return inner  # type: ignore[return-value]

    return wrap


HOST_READ = "ascend_ext.host_read"


def host_read(tensor: torch.Tensor) -> list:
    """``tensor`` read to the host as a list: a device-to-host copy, which waits for the
    device (a host sync). The plugin's hot paths make none, except the one the all-to-all
    token dispatcher is documented to make (``moe/alltoall.py``, opt-in); it goes through
    here so the op counter counts it, as ``HOST_READ``, where the emulated device (the CPU)
    would show no copy at all."""
    if _ACTIVE:
        for c in _ACTIVE:
            c._count(HOST_READ)
    return tensor.cpu().tolist()
