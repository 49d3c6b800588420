"""A stand-in torch_npu that holds every call to the operators' own contract.

``Harness(soc).namespace`` is what the plugin's NPU call sites get instead of
torch_npu in contract mode (``ops/_dispatch.py``): the same functions, the same keyword
arguments the NPU path passes. A call through it

(a) binds the arguments against torch-npu 2.13's schema (unknown keyword, wrong type,
    missing argument: violation);
(b) runs the official Meta kernel on meta tensors with the arguments' sizes, strides
    and dtypes (``torch.empty_strided``: ``.to("meta")`` would make a strided view
    contiguous and hide exactly what is looked for), pretending the harness's SoC and
    CANN version; a rejection is a violation carrying the official message;
(c) checks the documented rules the metas do not (``op_rules.py``, the group the
    operator's record names), the supported products and contiguous in-place writes;
(d) computes the values with the plugin's emulation of the operator (its record in
    ``ops/registry.py``) and checks that its outputs have the official meta's shapes and
    dtypes (and are contiguous where the meta's are, as the kernel's outputs are: code
    downstream may rely on it).

Any violation raises ``ContractViolation`` at once, naming the operator, the argument,
the rule and its source. Calls are counted per operator for the summary line.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from vllm.logger import init_logger

from vllm_ascend_ext.contract import docs, metas, op_rules, oracle, product_gaps, rules, schemas
from vllm_ascend_ext.errors import AscendExtError
from vllm_ascend_ext.ops import registry

if TYPE_CHECKING:  # the contract takes a SoC; it never imports the platform
    from vllm_ascend_ext.platform.soc import Soc

logger = init_logger("vllm.ascend_ext")
LOG_INTERVAL_S = 30.0  # the summary line, while calls are being validated


class ContractViolation(AscendExtError):
    """A call the NPU would reject or compute differently from what the plugin expects."""


def _meta_copy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(tuple(value.shape), tuple(value.stride()),
                                   dtype=value.dtype, device="meta")
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return type(value)(_meta_copy(v) for v in value)
    return value


def _flat(outputs: Any) -> list[torch.Tensor]:
    if isinstance(outputs, torch.Tensor):
        return [outputs]
    if isinstance(outputs, (list, tuple)):
        return [t for o in outputs for t in _flat(o)]
    return []


class _Namespace:
    """What the call sites see: ``namespace.npu_fused_infer_attention_score(...)``."""

    def __init__(self, harness: Harness) -> None:
        self._harness = harness

    def __getattr__(self, op: str):
        if op.startswith("__"):
            raise AttributeError(op)
        return lambda *args, **kwargs: self._harness.call(op, args, kwargs)


class Harness:
    def __init__(self, soc: Soc, cann_version: str = metas.DEFAULT_CANN_VERSION) -> None:
        self.soc = soc
        self.cann_version = cann_version
        self.calls: Counter[str] = Counter()
        self.violations = 0
        self.unspecified: set[str] = set()   # operators whose docs list no products
        self.doc_gaps: Counter[str] = Counter()   # op@family: calls on an unlisted SoC
        self.departures: Counter[str] = Counter()   # "op: what": deliberate, outside the docs
        self._lock = threading.RLock()  # _raise may run inside a locked section
        self._last_log = time.monotonic()
        self.namespace = _Namespace(self)

    # (a) ---------------------------------------------------------------------------------
    def _schema(self, op: str) -> tuple[schemas.Schema, str]:
        if op in op_rules.HAND_WRITTEN_SCHEMAS:
            text, source = op_rules.HAND_WRITTEN_SCHEMAS[op]
            return schemas.parse(text), source
        return schemas.schema(op), f"torch-npu {oracle.VERSION} yaml schema"

    # (b) ---------------------------------------------------------------------------------
    def _run_meta(self, schema: schemas.Schema, values: dict[str, Any]):
        if not metas.has_meta(schema.name):
            return None
        positional = [_meta_copy(values[p.name]) for p in schema.params if not p.kwarg_only]
        keywords = {p.name: _meta_copy(values[p.name]) for p in schema.params if p.kwarg_only}
        metas.Pretend.soc_version, metas.Pretend.cann_version = self.soc.version, self.cann_version
        return metas.op(schema.name, schema.overload or "default")(*positional, **keywords)

    def call(self, op: str, args: Sequence[Any], kwargs: dict[str, Any]):
        record = registry.TORCH_NPU_OPS.get(op)
        if record is None:
            raise ContractViolation(f"{op}: the plugin has no reference for this operator, "
                                    "so contract mode cannot compute it")
        schema, schema_source = self._schema(op)
        bound = schemas.bind(schema, args, kwargs)
        self._raise(op, [(arg, f"{problem} [{schema_source}]") for arg, problem in bound.problems])
        with self._lock:
            try:
                official = self._run_meta(schema, bound.values)
            except Exception as exc:  # noqa: BLE001 - the official meta rejected the call
                self._raise(op, [("*", f"the official Meta kernel rejects the call: "
                                       f"{str(exc).strip().splitlines()[0]}")])
        call = rules.Call(op, bound.values, self.soc.name, self.soc.family,
                          tuple(p.name for p in schema.params if p.mutable))
        problems = self._rule_problems(call, op_rules.rules_for(record))
        self._raise(op, problems)
        outputs = record.emulated(*args, **kwargs)
        self._check_outputs(op, official, outputs)
        with self._lock:
            self.calls[op] += 1
            due = time.monotonic() - self._last_log >= LOG_INTERVAL_S
            if due:
                self._last_log = time.monotonic()
        if due:
            logger.info(self.summary())
        return outputs

    # (c) ---------------------------------------------------------------------------------
    def _rule_problems(self, call: rules.Call,
                       documented: Sequence[rules.Rule]) -> list[tuple[str, str]]:
        problems = []
        product = rules.products_problem(call)
        if product and product_gaps.route(call.op, call.family) is not None:
            with self._lock:   # a gap only the product list implies: counted per SoC
                self.doc_gaps[f"{call.op}@{call.family}"] += 1
        elif product:
            problems.append(("*", f"{product} [{docs.SUPPORTED_PRODUCTS} of the torch_npu docs]"))
        if docs.families(call.op) is None:
            with self._lock:
                self.unspecified.add(call.op)
        for name, problem in rules.mutable_problems(call):
            problems.append((name, f"{problem}; written in place (Tensor(a!) in the schema), "
                                   "so it must be contiguous memory"))
        for rule in documented:
            problem = rule.check(call)
            if isinstance(problem, rules.Departure):
                with self._lock:
                    self.departures[f"{call.op}: {problem}"] += 1
            elif problem:
                note = f"; {rule.note}" if rule.note else ""
                problems.append((rule.argument, f"{problem} [rule: {rule.cites()}{note}]"))
        return problems

    # (d) ---------------------------------------------------------------------------------
    def _check_outputs(self, op: str, official: Any, outputs: Any) -> None:
        if official is None:
            return
        want, got = _flat(official), _flat(outputs)
        problems = []
        if len(want) != len(got):
            problems.append(("outputs", f"the reference returns {len(got)} tensors, the "
                                        f"official meta {len(want)}"))
        for i, (w, g) in enumerate(zip(want, got)):
            if tuple(w.shape) != tuple(g.shape) or w.dtype != g.dtype:
                problems.append((f"output {i}", f"the reference gives {tuple(g.shape)} {g.dtype}, "
                                                f"the official meta {tuple(w.shape)} {w.dtype}"))
            elif w.is_contiguous() and not g.is_contiguous():
                problems.append((f"output {i}", f"the reference gives strides {g.stride()}; the "
                                                "operator's output is contiguous"))
        self._raise(op, problems)

    def _raise(self, op: str, problems: list[tuple[str, str]]) -> None:
        if problems:
            with self._lock:
                self.violations += 1
            lines = [f"{op}: argument {arg}: {problem}" for arg, problem in problems]
            raise ContractViolation(
                f"NPU contract violated (pretending {self.soc.name}, {self.soc.family}): "
                + "\n  ".join(lines))

    def summary(self) -> str:
        with self._lock:
            total = sum(self.calls.values())
            per_op = ", ".join(f"{op}={n}" for op, n in sorted(self.calls.items()))
            unspecified = sorted(self.unspecified)
            violations = self.violations
            gaps = ", ".join(f"{k}={n}" for k, n in sorted(self.doc_gaps.items()))
            departures = ", ".join(f"{k}={n}" for k, n in sorted(self.departures.items()))
        tail = (f"; products unspecified in the docs: {', '.join(unspecified)}"
                if unspecified else "")
        if gaps:
            tail += (f"; documentation gaps (called on a SoC the docs do not list, route in "
                     f"contract/product_gaps.py): {gaps}")
        if departures:
            tail += f"; departures from the docs, made on purpose: {departures}"
        return (f"ascend_ext npu-contract: validated {total} calls ({per_op}), violations "
                f"{violations}{tail}")
