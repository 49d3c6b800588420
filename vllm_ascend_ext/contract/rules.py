"""Documented rules the official metas do not check, each quoting the line it rests on.

A rule belongs to one operator and one argument, and quotes its source: a needle that
``docs.line`` must find in the pinned documentation (so a rule cannot outlive its
source), or, for operators torch_npu documents nowhere in the wheel, a hand-written
source marked as such. Where the documentation contradicts itself, the rule records
both readings and the choice in ``note``.

Two rules hold for every operator and come from the oracle's structure rather than a
sentence: supported products (支持的型号: a violation when the pretended SoC's family is
not listed; an operator that lists none is recorded as unspecified, never as passing),
and in-place writes (an argument the schema marks ``Tensor(a!)`` must be written
through contiguous memory, never a strided view).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from vllm_ascend_ext.contract import docs
from vllm_ascend_ext.ops.format import format_name, npu_format

HAND_WRITTEN = "hand-written"


@dataclass(frozen=True)
class Call:
    """One operator call as the harness sees it."""

    op: str
    values: dict[str, Any]      # every schema argument, defaults filled in
    soc: str                    # pretended chip, e.g. "ascend910b2"
    family: str                 # "A2", "A3", "A5"
    mutable: tuple[str, ...]    # arguments the schema marks Tensor(a!)


Check = Callable[[Call], "str | None"]


class Departure(str):
    """What a check returns for a call outside the documentation that the plugin makes on
    purpose, the way production code on the hardware makes it (the text says which and
    why): counted per operator and listed in the summary, not a violation."""


@dataclass(frozen=True)
class Rule:
    op: str
    argument: str
    quote: str                  # doc needle, or the hand-written source when source != "doc"
    check: Check
    source: str = "doc"
    note: str = ""

    def cites(self) -> str:
        if self.source == "doc":
            return f'"{docs.line(self.op, self.quote)}" (torch_npu docs of {self.op})'
        return f'"{self.quote}" ({self.source})'


# Small checks rules are made of -------------------------------------------------------

def tensor(call: Call, name: str) -> torch.Tensor | None:
    value = call.values.get(name)
    return value if isinstance(value, torch.Tensor) else None


def contiguous(name: str) -> Check:
    def check(call: Call) -> str | None:
        t = tensor(call, name)
        if t is not None and not t.is_contiguous():
            return (f"non-contiguous tensor (shape {tuple(t.shape)}, strides {t.stride()}); "
                    "the operator does not take strided views")
        return None
    return check


def dtype_in(name: str, *allowed: torch.dtype) -> Check:
    def check(call: Call) -> str | None:
        t = tensor(call, name)
        if t is not None and t.dtype not in allowed:
            names = ", ".join(str(d).removeprefix("torch.") for d in allowed)
            return f"dtype {str(t.dtype).removeprefix('torch.')} not in {names}"
        return None
    return check


def dims_in(name: str, *allowed: int) -> Check:
    def check(call: Call) -> str | None:
        t = tensor(call, name)
        if t is not None and t.dim() not in allowed:
            return f"{t.dim()}-D tensor {tuple(t.shape)}; the documented shapes are {allowed}-D"
        return None
    return check


def same_dtype(name: str, as_name: str) -> Check:
    def check(call: Call) -> str | None:
        a, b = tensor(call, name), tensor(call, as_name)
        if a is not None and b is not None and a.dtype != b.dtype:
            return f"dtype {a.dtype} differs from {as_name}'s {b.dtype}"
        return None
    return check


def value_in(name: str, *allowed) -> Check:
    def check(call: Call) -> str | None:
        value = call.values.get(name)
        return None if value in allowed else f"{name}={value!r}; allowed: {list(allowed)}"
    return check


def npu_format_is(name: str, acl_format: int) -> Check:
    def check(call: Call) -> str | None:
        t = tensor(call, name)
        if t is not None and npu_format(t) != acl_format:
            return (f"format {format_name(npu_format(t))}; the operator takes "
                    f"{format_name(acl_format)} (cast once with npu_format_cast)")
        return None
    return check


def all_of(*checks: Check) -> Check:
    def check(call: Call) -> str | None:
        for c in checks:
            problem = c(call)
            if problem:
                return problem
        return None
    return check


def when(condition: Callable[[Call], bool], inner: Check) -> Check:
    return lambda call: inner(call) if condition(call) else None


def indices_in_range(name: str, upper: Callable[[Call], int], negative_ok: bool) -> Check:
    """Every index of ``name`` lies in [0, upper) (negative values allowed as padding)."""
    def check(call: Call) -> str | None:
        t = tensor(call, name)
        if t is None or t.numel() == 0 or t.device.type == "meta":
            return None
        values = t[t >= 0] if negative_ok else t
        bound = upper(call)
        low = int(t.min())
        if not negative_ok and low < 0:
            return f"index {low} < 0"
        if values.numel() and int(values.max()) >= bound:
            return f"index {int(values.max())} out of range (must be < {bound})"
        return None
    return check


# Rules of every operator ---------------------------------------------------------------

def products_problem(call: Call) -> str | None:
    listed = docs.families(call.op)
    if listed is None or call.family in listed:
        return None
    return (f"documented for {', '.join(listed)} only ({docs.SUPPORTED_PRODUCTS}); the "
            f"pretended SoC is {call.soc} ({call.family})")


def mutable_problems(call: Call) -> list[tuple[str, str]]:
    return [(name, problem) for name in call.mutable
            if (problem := contiguous(name)(call))]
