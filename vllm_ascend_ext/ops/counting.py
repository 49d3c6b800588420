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
that method while the counter is active; ``new_step`` opens one by hand. The plugin's
own layer entry ops (``TRANSPARENT_OPS``, e.g. ``ascend_ext.sfa_forward``) are entered
rather than counted: what runs inside them is counted, and marked as in-layer.
Production code knows nothing of this module beyond the ``npu_op`` name tag; with no
counter active that tag costs one list check.
"""

from __future__ import annotations

import functools
import importlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_ACTIVE: list[OpCounter] = []
# Bookkeeping, not kernels.
IGNORED_NAMESPACES = ("profiler",)
# Custom-op wrappers whose body is counted instead of the wrapper: name -> Python body.
TRANSPARENT_OPS = {"ascend_ext.sfa_forward": "vllm_ascend_ext.attention.sfa.layer:run_sfa_forward",
                   "ascend_ext.moe_routed_experts": "vllm_ascend_ext.moe.method:run_routed_experts",
                   "ascend_ext.gdn_forward": "vllm_ascend_ext.attention.gdn.layer:run_gdn_forward"}
# Which per-step tally each wrapper's body also goes to (StepCounts.in_layers / in_moe).
ATTENTION_REGION, MOE_REGION = "attention", "moe"
REGIONS = {"ascend_ext.sfa_forward": ATTENTION_REGION, "ascend_ext.gdn_forward": ATTENTION_REGION,
           "ascend_ext.moe_routed_experts": MOE_REGION}


@functools.cache
def import_body(target: str) -> Callable[..., Any]:
    """``"module:function"`` -> the function (a custom op's Python body)."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def _transparent_body(op_name: str) -> Callable[..., Any] | None:
    target = TRANSPARENT_OPS.get(op_name)
    return None if target is None else import_body(target)


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
        inner = _transparent_body(str(func.overloadpacket))
        if inner is not None:
            # The plugin's own entry ops (e.g. ascend_ext.sfa_forward) are wrappers:
            # count what runs inside them (their Python body), not the wrapper.
            self._regions.append(REGIONS[str(func.overloadpacket)])
            try:
                with self:
                    return inner(*args, **kwargs)
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
