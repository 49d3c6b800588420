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

import tests.npu.test_layer_parity as layer_parity
import tests.npu.test_moe_parity as moe_parity
import tests.npu.test_parity as fia_parity
import tests.npu.test_sfa_parity as sfa_parity
from vllm_ascend_ext.contract import mode
from vllm_ascend_ext.contract.harness import Harness
from vllm_ascend_ext.platform.soc import from_name
from vllm_ascend_ext.tools import npu_parity


def _cases():
    for module in (fia_parity, sfa_parity, moe_parity, layer_parity):
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
    mode.install()
    monkeypatch.setattr(npu_parity, "_npu", lambda t: t)
    test(**kwargs)
    assert harness.violations == 0
    torch_npu_calls = sum(harness.calls.values())
    own_library_only = test.__name__ == "test_k3_prolog_npu_kernel_matches_the_cpu_kernel"
    assert torch_npu_calls > 0 or own_library_only, harness.calls


def test_every_parity_test_is_dry_run():
    listed = {p.values[1].__name__ for p in _cases()}
    names = {n for m in (fia_parity, sfa_parity, moe_parity, layer_parity)
             for n, f in inspect.getmembers(m, inspect.isfunction) if n.startswith("test_")}
    assert listed == names
    assert len(list(itertools.islice(_cases(), 100))) >= len(names)


def test_doctor_smoke_runs_one_case_per_operator_dry(monkeypatch):
    monkeypatch.setenv(mode.ENV, "1")
    harness = Harness(from_name("ascend910b2"))
    monkeypatch.setattr(mode, "_HARNESS", [harness])
    mode.install()
    monkeypatch.setattr(npu_parity, "_npu", lambda t: t)
    results = npu_parity.run_smoke()
    assert [r["case"] for r in results] == [
        "fia", "scatter_pa_kv_cache", "kv_rmsnorm_rope_cache", "lightning_indexer",
        "sparse_flash_attention", "w8a8_quant_ops", "mla_prolog_v3[False]",
        "mla_prolog_v3[True]", "k3_prolog", "moe_routing", "moe_experts[False]",
        "moe_experts[True]", "rms_norm", "add_rms_norm", "gemma_rms_norm", "mrope['qwen3']",
        "mrope['qwen3_next']", "mrope['interleave']", "add_rms_norm_dynamic_quant",
        "moe_experts_w8a8_fused", "w8a8_mlp_activation"]
    assert all(r["ok"] for r in results), results
    assert harness.violations == 0
    assert {"npu_fused_infer_attention_score", "npu_scatter_pa_kv_cache",
            "npu_kv_rmsnorm_rope_cache", "npu_lightning_indexer", "npu_sparse_flash_attention",
            "npu_dynamic_quant", "npu_quant_matmul", "npu_mla_prolog_v3",
            "npu_format_cast", "npu_moe_gating_top_k", "npu_moe_gating_top_k_softmax",
            "npu_moe_init_routing_v2", "npu_grouped_matmul", "npu_swiglu",
            "npu_moe_token_unpermute", "npu_rms_norm", "npu_add_rms_norm", "npu_gemma_rms_norm",
            "npu_mrope", "npu_add_rms_norm_dynamic_quant",
            "npu_grouped_matmul_swiglu_quant", "npu_dequant_swiglu_quant"} <= set(harness.calls)


def test_a_smoke_case_that_fails_or_raises_is_reported():
    bad = npu_parity.Measured("err", 1.0, 0.5)
    worse = npu_parity.Measured("agreement", 0.5, 0.9, at_least=True)
    results = npu_parity.run_smoke((lambda: [bad, worse], lambda: 1 / 0))
    assert results[0]["ok"] is False and "bound <= 5.0e-01" in results[0]["measured"][0]
    assert results[1] == {"case": "<lambda>", "ok": False,
                          "error": "ZeroDivisionError: division by zero"}
