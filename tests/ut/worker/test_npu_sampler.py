"""The sampler's top-k / top-p filter on the NPU (``ops/top_k_top_p.py``,
``worker/npu_sampler.py``): the reference against the documented computation written as
a float64 loop, the contract rules, the gate, and vLLM's sampler warm-up on the NPU
platform with Triton importable (the start-up path an Atlas host with triton-ascend
takes), which must never reach vLLM's Triton filter nor need an answer the platform
does not give."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from vllm_ascend_ext.contract.layer_op_rules import LAYER_OP_RULES
from vllm_ascend_ext.contract.rules import Call
from vllm_ascend_ext.ops.top_k_top_p import npu_top_k_top_p, top_k_top_p_reference
from vllm_ascend_ext.worker import npu_sampler
from vllm_ascend_ext.worker.npu_sampler import NpuTopKTopP, fused_filter_applies

NEG = float("-inf")


def _documented(row: list[float], p: float | None, k: int | None) -> list[float]:
    """torch_npu's documented steps for one row, in float64 with plain Python."""
    v = len(row)
    order = sorted(range(v), key=lambda i: (row[i], i))  # ascending, stable
    vals = [row[i] for i in order]
    if k is not None:
        threshold = vals[v - k]
        vals = [NEG if x < threshold else x for x in vals]
    if p is not None:
        top = max(vals)
        exps = [0.0 if x == NEG else math.exp(x - top) for x in vals]
        total = sum(exps)
        cum, drop = 0.0, []
        for e in exps:
            cum += e / total
            drop.append(cum <= 1 - p)
        drop[-1] = False
        vals = [NEG if d else x for x, d in zip(vals, drop)]
    out = [0.0] * v
    for pos, i in enumerate(order):
        out[i] = vals[pos]
    return out


def _case(ties: bool = True):
    """Five rows of 40; row 1 ties at its top-k threshold (vLLM's filter sorts without the
    documented stability, so tied rows are compared with it only where ``ties`` is off)."""
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(5, 40, generator=g, dtype=torch.float64)
    if ties:
        logits[1] = logits[1] * 0.1 - 1
        logits[1, 3:9] = 0.5      # ties at the top-k threshold (k = 4): all kept
        logits[1, 20:22] = 1.0
    logits[2, 10] = NEG           # a row vLLM already masked
    p = torch.tensor([0.9, 0.5, 1.0, 0.0, 0.75], dtype=torch.float64)
    k = torch.tensor([5, 4, 40, 1, 12], dtype=torch.int32)
    return logits, p, k


@pytest.mark.parametrize("which", ["both", "k", "p"])
def test_reference_equals_the_documented_steps(which):
    logits, p, k = _case()
    p_, k_ = (p if which != "k" else None), (k if which != "p" else None)
    got = top_k_top_p_reference(logits, p_, k_)
    for b in range(logits.shape[0]):
        want = _documented(logits[b].tolist(), None if p_ is None else float(p[b]),
                           None if k_ is None else int(k[b]))
        assert got[b].tolist() == want, b
    # the case means something: ties kept beyond k, p = 0 keeps one, p = 1 keeps all
    if which == "k":
        assert int(torch.isfinite(got[1]).sum()) == 8     # k = 4: two above, six tied
    if which != "k":
        assert int(torch.isfinite(got[3]).sum()) == 1
        assert int(torch.isfinite(got[2]).sum()) == 39    # only the row's own -inf


def test_reference_equals_vllms_pytorch_filter_in_float32():
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    logits, p, k = _case(ties=False)
    x = logits.float()
    ours = top_k_top_p_reference(x, p.float(), k)
    theirs = apply_top_k_top_p_pytorch(x.clone(), k, p.float())
    assert torch.equal(torch.isfinite(ours), torch.isfinite(theirs))
    assert torch.equal(ours[torch.isfinite(ours)], theirs[torch.isfinite(theirs)])


def test_the_entry_dispatches_by_device_and_refuses_neither():
    logits, p, k = _case()
    meta = npu_top_k_top_p(logits.float().to("meta"), p.float().to("meta"), k.to("meta"))
    assert meta.shape == logits.shape and meta.device.type == "meta"
    with pytest.raises(ValueError, match="p and k cannot both be None"):
        npu_top_k_top_p(logits)


def _problems(**values):
    call = Call(op="npu_top_k_top_p", values=values, soc="ascend910b2", family="A2", mutable=())
    return sorted(r.argument for r in LAYER_OP_RULES if r.op == call.op and r.check(call))


def test_contract_rules_hold_the_documented_ranges():
    x = torch.randn(3, 2048)
    p, k = torch.tensor([0.9, 1.0, 0.0]), torch.tensor([1, 1024, 50], dtype=torch.int32)
    assert _problems(logits=x, p=p, k=k) == []
    assert _problems(logits=x, p=p, k=None) == []
    assert _problems(logits=x, p=None, k=None) == ["p"]
    assert _problems(logits=x, p=p, k=torch.tensor([1, 1025, 50], dtype=torch.int32)) == ["k"]
    assert _problems(logits=x, p=p, k=torch.tensor([0, 5, 50], dtype=torch.int32)) == ["k"]
    assert _problems(logits=x, p=p, k=k.long()) == ["k"]
    assert _problems(logits=x[:, :512], p=p, k=k) == ["k"]       # k above the vocabulary
    assert _problems(logits=x, p=p.double(), k=k) == ["p"]       # p's dtype is the logits'
    assert _problems(logits=x, p=torch.tensor([0.9, 1.5, 0.0]), k=k) == ["p"]
    assert _problems(logits=x, p=p[:2], k=k) == ["p"]
    assert _problems(logits=x.double(), p=p.double(), k=k) == ["logits"]


def test_the_gate_takes_the_operator_only_where_documented():
    assert fused_filter_applies("A2", 151936, 50, has_top_k=True)
    assert fused_filter_applies("A3", 151936, 1024, has_top_k=True)
    assert fused_filter_applies("A2", 151936, None, has_top_k=False)      # top-p only
    assert not fused_filter_applies("A2", 151936, 1025, has_top_k=True)   # k = vocab rows
    assert not fused_filter_applies("A2", 151936, None, has_top_k=True)   # k unknown
    assert not fused_filter_applies("A2", 100, 200, has_top_k=True)
    assert not fused_filter_applies("A5", 151936, 50, has_top_k=True)     # not on 950


class _Inner(torch.nn.Module):
    logprobs_mode = "raw_logprobs"

    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, logits, generators, k, p):
        self.seen.append((logits.clone(), k, p))
        return logits.argmax(-1), None


@pytest.mark.parametrize("family,host_k,fused", [("A2", 12, 1), ("A5", 12, 0),
                                                  ("A2", None, 0)])
def test_the_wrapper_filters_then_hands_vllm_no_filter(family, host_k, fused):
    logits, p, k = _case(ties=False)
    x = logits.float()
    inner = _Inner()
    wrapper = NpuTopKTopP(inner, family)
    wrapper.host_top_k_max = host_k
    wrapper(x.clone(), {}, k, p.float())
    filtered, k_seen, p_seen = inner.seen[0]
    assert k_seen is None and p_seen is None and wrapper.fused_calls == fused
    want = torch.tensor([_documented(x[b].double().tolist(), float(p[b].float()), int(k[b]))
                         for b in range(x.shape[0])])
    assert torch.equal(torch.isfinite(filtered), torch.isfinite(want))


def test_host_top_k_max_reads_the_batchs_host_copy():
    import numpy as np

    batch = SimpleNamespace(num_reqs=3, no_top_k=False,
                            top_k_cpu=np.array([5, 1024, 7, 99999], dtype=np.int32))
    assert npu_sampler.host_top_k_max(batch) == 1024
    assert npu_sampler.host_top_k_max(SimpleNamespace(num_reqs=3, no_top_k=True,
                                                      top_k_cpu=batch.top_k_cpu)) is None


def _warm_up(monkeypatch, wrap: bool):
    """vLLM's ``_dummy_sampler_run`` through the NPU runner, with Triton importable and the
    NPU platform current; vLLM's Triton filter raises if reached."""
    import vllm.v1.sample.ops.topk_topp_sampler as tts
    import vllm.v1.sample.ops.topk_topp_triton as triton_ops
    from vllm.v1.sample.sampler import Sampler

    from vllm_ascend_ext.platform.npu import AscendNPUPlatform
    from vllm_ascend_ext.worker.npu_model_runner import AscendNPUModelRunner

    def triton_filter(*args, **kwargs):
        raise AssertionError("vLLM's Triton top-k/top-p filter was reached")

    monkeypatch.setattr(tts, "HAS_TRITON", True)
    monkeypatch.setattr(tts, "apply_top_k_top_p_triton", triton_filter, raising=False)
    # vLLM registers its Triton kernel's JIT warm-up (no registry is active here)
    monkeypatch.setattr(tts, "_topk_topp", triton_ops._topk_topp, raising=False)
    monkeypatch.setattr(tts, "current_platform", AscendNPUPlatform())
    vocab = 300
    sampler = Sampler("raw_logprobs")
    assert sampler.topk_topp_sampler.forward == sampler.topk_topp_sampler.forward_native
    if wrap:
        sampler.topk_topp_sampler = NpuTopKTopP(sampler.topk_topp_sampler, "A2")
    head = torch.randn(16, vocab, generator=torch.Generator().manual_seed(3))
    runner = AscendNPUModelRunner.__new__(AscendNPUModelRunner)
    runner.__dict__.update(
        vllm_config=SimpleNamespace(model_config=SimpleNamespace(multimodal_config=None)),
        model_config=SimpleNamespace(get_vocab_size=lambda: vocab),
        model=SimpleNamespace(compute_logits=lambda h: h @ head), device=torch.device("cpu"),
        sampler=sampler, speculative_config=None)
    runner._dummy_sampler_run(torch.zeros(4, 16))
    return sampler


def test_vllms_sampler_warm_up_on_the_npu_platform_with_triton_takes_npu_top_k_top_p(
        monkeypatch):
    from vllm_ascend_ext.ops.counting import OpCounter

    with OpCounter() as counter:
        sampler = _warm_up(monkeypatch, wrap=True)
    # two dummy samples (without and with a generator), each filtered by the operator
    assert sampler.topk_topp_sampler.fused_calls == 2
    assert counter.total()["npu_top_k_top_p"] == 2
    assert sampler.topk_topp_sampler.host_top_k_max is None  # reset after the warm-up


def test_negative_control_vllms_own_filter_takes_triton_there(monkeypatch):
    with pytest.raises(AssertionError, match="Triton top-k/top-p filter was reached"):
        _warm_up(monkeypatch, wrap=False)


def test_the_npu_platform_answers_num_compute_units(monkeypatch):
    from vllm_ascend_ext.platform.npu import AscendNPUPlatform

    asked = []
    npu = SimpleNamespace(get_device_limit=lambda d: asked.append(d) or
                          {"cube_core_num": 24, "vector_core_num": 48})
    monkeypatch.setattr(torch, "npu", npu, raising=False)
    assert AscendNPUPlatform.num_compute_units(1) == 48 and asked == [1]
