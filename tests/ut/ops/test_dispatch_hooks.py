"""What the layers and the emulated NPU runtime install into ``ops/`` (which imports
neither): layer entry ops declared where they are registered (``counting.layer_entry``),
read by the op counter and the emulated graph capture; the graph recorder's kernel
wrapper installed into the dispatch when the stand-in runtime is brought up
(``_dispatch.install_kernel_wrapper``), the plain implementation without it."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend_ext.emulation import cpu_npu, cpu_npu_graph
from vllm_ascend_ext.emulation.cpu_npu_graph import GraphCaptureError
from vllm_ascend_ext.ops import _dispatch, counting
from vllm_ascend_ext.ops.counting import OpCounter
from vllm_ascend_ext.ops.norm import npu_rms_norm

NAMESPACE = "ascend_ext"           # the plugin's Python-op namespace (the graph recorder's)
OP = "_test_layer_entry"
NAME = f"{NAMESPACE}.{OP}"
_LIB: list = []


def entry_body(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """A layer's Python: one plugin operator and one ATen op."""
    return npu_rms_norm(x, g)[0] + 1


def _op():
    if not _LIB:
        lib = torch.library.Library(NAMESPACE, "FRAGMENT")
        lib.define(f"{OP}(Tensor x, Tensor g) -> Tensor")
        lib.impl(OP, entry_body, "CPU")
        _LIB.append(lib)
    return getattr(torch.ops, NAMESPACE)._test_layer_entry


@pytest.fixture
def declared():
    """The test op declared a layer entry (removed afterwards)."""
    op = _op()
    entry = counting.layer_entry(NAME, entry_body, counting.MOE_REGION)
    yield op, entry
    counting.LAYER_ENTRIES.pop(NAME, None)


@pytest.fixture
def no_kernel_wrapper(monkeypatch):
    monkeypatch.setattr(_dispatch, "_KERNEL_WRAPPER", [])


def _inputs():
    return torch.randn(2, 8), torch.ones(8)


# -- layer entries ------------------------------------------------------------------------

def test_the_counter_enters_a_declared_layer_entry_and_tallies_its_region(declared):
    op, _ = declared
    args = _inputs()
    with OpCounter() as c:
        op(*args)
    step = c.steps[0]
    assert step.ops == {"npu_rms_norm": 1, "aten.add": 1}
    assert step.in_moe == step.ops and not step.in_layers


def test_an_undeclared_entry_op_is_one_opaque_op_to_the_counter_outside_any_region():
    op = _op()
    assert NAME not in counting.LAYER_ENTRIES
    args = _inputs()
    with OpCounter() as c:
        op(*args)
    step = c.steps[0]
    assert step.ops[NAME] == 1 and "aten.add" not in step.ops     # its ATen ops unseen
    assert not step.in_moe and not step.in_layers


def test_declaring_again_is_a_no_op_a_different_body_or_region_a_conflict(declared):
    _, entry = declared
    assert counting.layer_entry(NAME, entry_body, counting.MOE_REGION) == entry
    with pytest.raises(counting.LayerEntryConflict):
        counting.layer_entry(NAME, lambda x, g: x, counting.MOE_REGION)
    with pytest.raises(counting.LayerEntryConflict):
        counting.layer_entry(NAME, entry_body, counting.ATTENTION_REGION)
    with pytest.raises(ValueError, match="region"):
        counting.layer_entry("ascend_ext.other", entry_body, "mlp")
    assert counting.layer_entry_body(f"{NAMESPACE}::{OP}") is entry_body
    assert counting.layer_entry_body("ascend_ext::nothing") is None


def test_graph_capture_records_the_kernels_of_a_declared_entry(declared):
    op, _ = declared
    rt = cpu_npu.make_runtime()
    x, g_ = _inputs()
    graph = rt.NPUGraph()
    with rt.graph(graph):
        y = op(x, g_)
    assert graph.num_calls() == 2          # the operator (one kernel) and the add
    x.copy_(x * 2)
    graph.replay()
    torch.testing.assert_close(y, entry_body(x, g_))


def test_graph_capture_refuses_an_undeclared_entry_naming_the_declaration():
    op = _op()
    rt = cpu_npu.make_runtime()
    args = _inputs()
    with pytest.raises(GraphCaptureError, match="layer_entry"):
        with rt.graph(rt.NPUGraph()):
            op(*args)


# -- the kernel wrapper -------------------------------------------------------------------

def test_without_a_kernel_wrapper_pick_returns_the_plain_implementation(no_kernel_wrapper):
    def reference(x):
        return x

    assert _dispatch.pick(torch.device("cpu"), npu=None, reference=reference,
                          meta=None) is reference
    _dispatch.install_kernel_wrapper(lambda impl, meta: ("wrapped", impl, meta))
    assert _dispatch.pick(torch.device("cpu"), npu=None, reference=reference,
                          meta="its meta") == ("wrapped", reference, "its meta")
    assert _dispatch.pick(torch.device("meta"), npu=None, reference=reference,
                          meta="meta") == "meta"


def test_bringing_up_the_stand_in_runtime_installs_the_graph_recorders_wrapper(
        no_kernel_wrapper, monkeypatch):
    monkeypatch.setenv("ASCEND_EXT_PY_REFERENCE", "1")   # the reference: several ATen ops
    x, g_ = _inputs()
    rt = cpu_npu.make_runtime()
    assert _dispatch._KERNEL_WRAPPER == [cpu_npu_graph.as_kernel]
    graph = rt.NPUGraph()
    with rt.graph(graph):
        npu_rms_norm(x, g_)
    assert graph.num_calls() == 1          # one operator call, one kernel


def test_a_capture_without_the_wrapper_would_record_the_references_aten_ops(
        no_kernel_wrapper, monkeypatch):
    """The negative control: what the wrapper prevents."""
    monkeypatch.setenv("ASCEND_EXT_PY_REFERENCE", "1")
    rt = cpu_npu.make_runtime()
    _dispatch._KERNEL_WRAPPER.clear()
    args = _inputs()
    graph = rt.NPUGraph()
    with rt.graph(graph):
        npu_rms_norm(*args)
    assert graph.num_calls() > 1
