"""OpCounter: plugin operators count once and hide their internals; views and casts apart."""

from types import SimpleNamespace

import torch

from vllm_ascend_ext.ops.counting import OpCounter
from vllm_ascend_ext.ops.norm import npu_rms_norm


def test_npu_ops_are_opaque_aten_ops_counted_views_apart_and_casts_directional():
    x = torch.randn(4, 8)
    g = torch.ones(8)
    with OpCounter() as c:
        npu_rms_norm(x, g)               # one kernel on the NPU, many aten ops in the reference
        c.new_step("decode")
        y = x.view(2, 16)                # view: no kernel
        _ = y + 1
        _ = torch.arange(4).to(torch.int32)
    assert c.steps[0].ops == {"npu_rms_norm": 1}
    step = c.steps[1]
    assert step.kind == "decode" and step.views == 1
    assert step.ops["aten.add"] == 1
    assert step.ops["aten._to_copy[torch.int64->torch.int32]"] == 1
    assert "aten.rsqrt" not in c.total()


def test_no_counter_no_bookkeeping():
    out, rstd = npu_rms_norm(torch.ones(2, 4), torch.ones(4))
    assert out.shape == (2, 4) and rstd.shape == (2, 1)


class _Builder:
    def build(self, kind):
        return SimpleNamespace(kind=kind)


def test_steps_are_opened_by_the_watched_builder_and_the_builder_is_restored():
    original = _Builder.build
    with OpCounter(steps_of=_Builder) as c:
        _ = torch.ones(2) + 1
        _Builder().build("prefill")
        _ = torch.ones(2) * 2
        _Builder().build("decode")
    assert [s.kind for s in c.steps] == ["before-first-step", "prefill", "decode"]
    assert c.steps[1].ops["aten.mul"] == 1 and "aten.mul" not in c.steps[2].ops
    assert _Builder.build is original


class _SubBuilder(_Builder):
    """``build`` inherited: wrapped on the subclass while counting, then removed."""


def test_an_inherited_build_is_wrapped_and_restored():
    with OpCounter(steps_of=_SubBuilder) as c:
        _SubBuilder().build("decode")
    assert [s.kind for s in c.steps] == ["before-first-step", "decode"]
    assert "build" not in _SubBuilder.__dict__ and _SubBuilder.build is _Builder.build
