"""The NPU parity suite (tests/npu, skipped without an NPU) run dry on the CPU: its
torch_npu calls go through the contract harness instead of an NPU.

This keeps the suite that runs first on an Atlas 800 runnable where it was written
(it had never run) and proves that every call it makes meets torch-npu 2.13's contract
with the shapes, strides and layouts the engine passes. The values it compares are then
reference against reference: the numerics wait for the NPU.
"""

from __future__ import annotations

import inspect
import itertools

import pytest

import tests.npu.test_parity as fia_parity
import tests.npu.test_sfa_parity as sfa_parity
from vllm_ascend_ext.contract import mode
from vllm_ascend_ext.contract.harness import Harness
from vllm_ascend_ext.platform.soc import from_name


def _cases():
    for module in (fia_parity, sfa_parity):
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if not name.startswith("test_"):
                continue
            marks = [m for m in getattr(fn, "pytestmark", []) if m.name == "parametrize"]
            if not marks:
                yield pytest.param(module, fn, {}, id=f"{module.__name__.split('.')[-1]}::{name}")
                continue
            names = [n.strip() for n in marks[0].args[0].split(",")]
            for i, values in enumerate(marks[0].args[1]):
                values = values if isinstance(values, tuple) else (values,)
                yield pytest.param(module, fn, dict(zip(names, values)),
                                   id=f"{module.__name__.split('.')[-1]}::{name}[{i}]")


@pytest.mark.parametrize("module,test,kwargs", list(_cases()))
def test_parity_case_meets_the_contract(monkeypatch, module, test, kwargs):
    monkeypatch.setenv(mode.ENV, "1")
    harness = Harness(from_name("ascend910b2"))
    monkeypatch.setattr(mode, "_HARNESS", [harness])
    monkeypatch.setattr(module, "_npu", lambda t: t)
    test(**kwargs)
    assert harness.violations == 0
    torch_npu_calls = sum(harness.calls.values())
    own_library_only = test.__name__ == "test_k3_prolog_npu_kernel_matches_the_cpu_kernel"
    assert torch_npu_calls > 0 or own_library_only, harness.calls


def test_every_parity_test_is_dry_run():
    listed = {p.values[1].__name__ for p in _cases()}
    names = {n for m in (fia_parity, sfa_parity) for n, f in inspect.getmembers(m, inspect.isfunction)
             if n.startswith("test_")}
    assert listed == names
    assert len(list(itertools.islice(_cases(), 100))) >= len(names)
