"""The compiled op library _C_ascend_ext: the K3 MLA prolog, its identity, its fallback.

README's install builds the library; these tests fail (not skip) when it is missing.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_ascend_ext.ops import _ext
from vllm_ascend_ext.ops.mla_prolog_k3 import mla_prolog_v3_k3_reference, npu_mla_prolog_v3_k3

# torch_npu / CANN operator names the plugin's library must never take (issue list + kin).
TORCH_NPU_NAMES = {
    "npu_mla_prolog", "npu_mla_prolog_v2", "npu_mla_prolog_v3", "npu_mla_prolog_v3_functional",
    "npu_fused_infer_attention_score", "npu_fused_infer_attention_score_v2",
    "npu_sparse_flash_attention", "npu_lightning_indexer", "npu_quant_lightning_indexer",
    "npu_kv_rmsnorm_rope_cache", "npu_kv_rmsnorm_rope_cache_v2", "npu_interleave_rope",
    "npu_rms_norm", "npu_dynamic_quant", "npu_quant_matmul", "npu_incre_flash_attention",
    "npu_prompt_flash_attention", "npu_moe_init_routing", "npu_grouped_matmul",
}


def test_readme_install_built_the_library():
    assert _ext.load(), "vllm_ascend_ext._C_ascend_ext is missing: README's install must build it"
    assert "npu_mla_prolog_v3_k3" in _ext.registered_ops()


@pytest.mark.parametrize("op", ["npu_mla_prolog_v3_k3", "npu_causal_conv1d_ext",
                                "npu_recurrent_gated_delta_rule_ext"])
def test_plugin_ops_serve_every_device_not_only_a_cann_build(op):
    # one composite registration: an NPU (PrivateUse1) has the op even where the library
    # was built without CANN; Meta keeps its explicit kernel
    assert _ext.load()
    table = torch._C._dispatch_dump_table(f"_C_ascend_ext::{op}")
    rows = dict(line.split(": ", 1) for line in table.splitlines() if ": " in line)
    for key in ("CPU", "PrivateUse1", "CUDA"):
        assert rows[key].endswith("[default backend kernel]"), (key, rows.get(key))
    assert rows["Meta"].endswith("[kernel]")
    # the emulation kernels stay CPU-only
    emu = dict(line.split(": ", 1) for line in torch._C._dispatch_dump_table(
        "_C_ascend_ext::emu_fused_infer_attention_score").splitlines() if ": " in line)
    assert "registration.cpp" in emu["CPU"] and "registration.cpp" not in emu.get("PrivateUse1", "")


def _inputs(t, he, hcq, n, d, hckv, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: (torch.randn(*s, generator=g) / math.sqrt(s[0])).to(dtype)  # noqa: E731
    return dict(x=torch.randn(t, he, generator=g).to(dtype), w_dq=r(he, hcq), w_uq=r(hcq, n * d),
                w_uk=r(n, d, hckv), w_dkv=r(he, hckv),
                g_cq=(1 + 0.1 * torch.randn(hcq, generator=g)).to(dtype),
                g_ckv=(1 + 0.1 * torch.randn(hckv, generator=g)).to(dtype))


def _independent(inp, mid):
    """Loops in float64, rounding x @ W_dq to x's dtype, c^Q and q to the weights' dtype."""
    x, out = inp["x"].double(), []
    n, d, hckv = inp["w_uk"].shape
    for t in range(x.shape[0]):
        a = (x[t] @ inp["w_dq"].double()).to(inp["x"].dtype).double()
        cq = (a / math.sqrt(float((a * a).mean()) + 1e-5) * inp["g_cq"].double()).to(mid).double()
        q = (cq @ inp["w_uq"].double()).view(n, d).to(mid).double()
        query = torch.stack([q[h] @ inp["w_uk"][h].double() for h in range(n)])
        kv = x[t] @ inp["w_dkv"].double()
        ckv = kv / math.sqrt(float((kv * kv).mean()) + 1e-5) * inp["g_ckv"].double()
        out.append((query, cq, ckv))
    return out


def _call(fn, inp, cache, **kw):
    return fn(inp["x"], inp["w_dq"], inp["w_uq"], inp["w_uk"], inp["w_dkv"], inp["g_cq"],
              inp["g_ckv"], cache, **kw)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(t=st.integers(1, 9), n=st.sampled_from([1, 2, 4]), d=st.sampled_from([96, 128]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]), flag=st.booleans(),
       strided=st.booleans(), seed=st.integers(0, 10_000), data=st.data())
def test_pa_bsnd_kernel_equals_reference_equals_independent_math(t, n, d, dtype, flag, strided,
                                                                  seed, data):
    he, hcq, hckv, bs, nb = 32, 24, 16, 4, 6
    inp = _inputs(t, he, hcq, n, d, hckv, dtype, seed)
    slots = data.draw(st.lists(st.integers(-1, nb * bs - 1), min_size=t, max_size=t, unique_by=lambda s: s if s >= 0 else object()))
    idx = torch.tensor(slots, dtype=torch.int64)
    width = hckv + (8 if strided else 0)        # strided: the cache is a view into wider rows
    rows_k, rows_r = torch.full((nb, bs, 1, width), 7.0, dtype=dtype), torch.full((nb, bs, 1, width), 7.0, dtype=dtype)
    ck, cr = rows_k[..., :hckv], rows_r[..., :hckv]
    qk, nk = _call(npu_mla_prolog_v3_k3, inp, ck, cache_index=idx, query_norm_flag=flag)
    qr, nr = _call(mla_prolog_v3_k3_reference, inp, cr, cache_index=idx, query_norm_flag=flag)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(qk, qr, **tol)
    torch.testing.assert_close(rows_k, rows_r, **tol)
    assert (nk is None) == (not flag) and (nr is None) == (not flag)
    for i, (want_q, want_cq, want_ckv) in enumerate(_independent(inp, dtype)):
        torch.testing.assert_close(qk[i].double(), want_q, **tol)
        if flag:
            torch.testing.assert_close(nk[i].double(), want_cq, **tol)
        s = slots[i]
        if s >= 0:
            torch.testing.assert_close(rows_k[s // bs, s % bs, 0, :hckv].double(), want_ckv, **tol)
    written = {s for s in slots if s >= 0}
    for s in range(nb * bs):
        if s not in written:
            assert (rows_k[s // bs, s % bs] == 7.0).all()
        assert (rows_k[s // bs, s % bs, 0, hckv:] == 7.0).all()


def test_bf16_rounds_x_at_w_dq_before_the_cq_rmsnorm_like_the_owners_golden():
    """The owners' CPU golden for bf16 (non-quantized): x @ W_dq accumulated in fp32 and rounded
    to bf16; RmsNorm in float, x / sqrt(mean(x^2) + eps) * gamma * qc_qr_scale, rounded to bf16
    (query_norm); c^Q @ W_uq_qr rounded to bf16, times W_uk[n], rounded to bf16. DeepSeek's
    shapes without the rope part. x and W_dq are small multiples of powers of two, so x @ W_dq
    is exact in fp32 in any summation order: only the rounding points decide c^Q."""
    t, he, hcq, n, d, hckv, eps, scale = 8, 7168, 1536, 32, 128, 512, 1e-6, 0.75
    g = torch.Generator().manual_seed(3)
    ints = lambda *s: torch.randint(-4, 5, s, generator=g).double()  # noqa: E731
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64) / math.sqrt(s[-2])  # noqa: E731
    bf = lambda v: v.to(torch.bfloat16).double()  # noqa: E731
    x, w_dq, w_uq, w_uk = bf(ints(t, he) / 4), bf(ints(he, hcq) / 64), bf(rnd(hcq, n * d)), bf(rnd(n, d, hckv))
    w_dkv = bf(rnd(he, hckv))
    g_cq, g_ckv = bf(1 + 0.1 * rnd(hcq, 1)[:, 0]), bf(1 + 0.1 * rnd(hckv, 1)[:, 0])
    # the golden, in float64 with explicit bf16 roundings
    mm1 = bf(x @ w_dq)
    want_cq = bf(mm1 / torch.sqrt((mm1 ** 2).mean(-1, keepdim=True) + eps) * g_cq * scale)
    q_nope = bf(want_cq @ w_uq).view(t, n, d)
    want_q = bf(torch.stack([q_nope[:, h] @ w_uk[h] for h in range(n)], 1))
    args = [v.to(torch.bfloat16) for v in (x, w_dq, w_uq, w_uk, w_dkv, g_cq, g_ckv)]
    outs = []
    for fn in (npu_mla_prolog_v3_k3, mla_prolog_v3_k3_reference):
        cache = torch.zeros(2, 8, 1, hckv, dtype=torch.bfloat16)
        q, qn = fn(*args, cache, cache_index=torch.arange(t), rmsnorm_epsilon_cq=eps,
                   query_norm_flag=True, qc_qr_scale=scale)
        outs.append((q, qn, cache))
        for got, want in ((qn, want_cq), (q, want_q)):
            # fp32 vs float64 may flip a bf16 rounding (or, in a query cancelling to near 0,
            # miss by the fp32 error): a few elements, by about one ulp, no more
            off = got.double() != want
            assert int(off.sum()) <= want.numel() // 1000, (fn.__name__, int(off.sum()), want.numel())
            torch.testing.assert_close(got.double(), want, rtol=2.0 ** -7, atol=2.0 ** -10)
    for a, b in zip(outs[0], outs[1]):                     # the C++ kernel == the reference
        assert torch.equal(a, b)


@pytest.mark.parametrize("with_index", [False, True])
def test_bsnd_layout_writes_positions_per_batch_row(with_index):
    b, s, he, hcq, n, d, hckv = 2, 3, 32, 24, 2, 128, 16
    inp = _inputs(b * s, he, hcq, n, d, hckv, torch.float32, 5)
    inp["x"] = inp["x"].view(b, s, he)
    idx = torch.tensor([[4, -1, 0], [1, 2, 3]], dtype=torch.int64) if with_index else None
    ck, cr = torch.zeros(b, 5, 1, hckv), torch.zeros(b, 5, 1, hckv)
    qk, _ = _call(npu_mla_prolog_v3_k3, inp, ck, cache_index=idx, cache_mode="BSND")
    qr, _ = _call(mla_prolog_v3_k3_reference, inp, cr, cache_index=idx, cache_mode="BSND")
    torch.testing.assert_close(qk, qr)
    torch.testing.assert_close(ck, cr)
    want = _independent({**inp, "x": inp["x"].reshape(b * s, he)}, torch.float32)
    pos = idx.tolist() if with_index else [[0, 1, 2], [0, 1, 2]]
    for bi in range(b):
        for si in range(s):
            if pos[bi][si] >= 0:
                torch.testing.assert_close(ck[bi, pos[bi][si], 0].double(), want[bi * s + si][2],
                                           rtol=1e-5, atol=1e-5)
    assert qk.shape == (b * s, n, hckv)


def test_meta_kernel_gives_shapes():
    inp = {k: v.to("meta") for k, v in _inputs(5, 32, 24, 4, 96, 16, torch.bfloat16, 0).items()}
    q, qn = _call(torch.ops._C_ascend_ext.npu_mla_prolog_v3_k3, inp,
                  torch.empty(3, 16, 1, 16, device="meta", dtype=torch.bfloat16),
                  cache_index=torch.empty(5, dtype=torch.int64, device="meta"), query_norm_flag=True)
    assert q.device.type == "meta" and q.shape == (5, 4, 16) and q.dtype == torch.bfloat16
    assert qn.shape == (5, 24)


@pytest.mark.parametrize("fn", [npu_mla_prolog_v3_k3, mla_prolog_v3_k3_reference])
def test_bad_inputs_name_the_argument(fn):
    inp = _inputs(3, 32, 24, 2, 96, 16, torch.float32, 1)
    cache = torch.zeros(2, 4, 1, 16)
    with pytest.raises((RuntimeError, ValueError), match="cache_index must be int64"):
        _call(fn, inp, cache, cache_index=torch.tensor([0, 1, 2], dtype=torch.int32))
    with pytest.raises((RuntimeError, ValueError), match="nope head dim must be 96 or 128"):
        bad = _inputs(3, 32, 24, 2, 64, 16, torch.float32, 1)
        _call(fn, bad, cache, cache_index=torch.tensor([0, 1, 2]))


# --------------------------------------------------------------- identity / collisions
def test_no_op_takes_a_torch_npu_name():
    ops = _ext.registered_ops()
    assert ops and not set(ops) & TORCH_NPU_NAMES
    assert all(op.endswith("_k3") or not op.startswith("npu_mla_prolog") for op in ops)


def test_shared_object_has_no_unsuffixed_mla_prolog_symbols():
    import vllm_ascend_ext._C_ascend_ext as lib

    so = Path(lib.__file__)
    for flags in (["-D", "--defined-only"], ["--defined-only"]):
        out = subprocess.run(["nm", *flags, "-C", str(so)], capture_output=True, text=True)
        assert out.returncode == 0 or "no symbols" in out.stderr, out.stderr
        for line in out.stdout.splitlines():
            low = line.lower()
            if "mla_prolog" in low or "mlaprolog" in low:
                assert "k3" in low, line
    exported = subprocess.run(["nm", "-D", "--defined-only", str(so)], capture_output=True,
                              text=True).stdout
    assert "PyInit__C_ascend_ext" in exported


def test_a_second_registration_fails_loudly():
    _ext.load()
    with pytest.raises(RuntimeError, match="_C_ascend_ext"):
        torch.library.Library("_C_ascend_ext", "DEF")
    frag = torch.library.Library("_C_ascend_ext", "FRAGMENT")
    with pytest.raises(RuntimeError, match="npu_mla_prolog_v3_k3"):
        frag.define("npu_mla_prolog_v3_k3(Tensor x) -> Tensor")


def test_plugin_start_reports_a_missing_library(monkeypatch, caplog):
    import importlib.util
    import logging

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == _ext.MODULE else real(name, *a))
    monkeypatch.setattr(_ext, "_state", {})
    monkeypatch.setattr(logging.getLogger("vllm.ascend_ext"), "propagate", True)
    with caplog.at_level(logging.WARNING, logger="vllm.ascend_ext"):
        assert _ext.report_if_missing() is False
    assert "was not built" in caplog.text
    monkeypatch.setattr(importlib.util, "find_spec", real)
    assert _ext.report_if_missing() is True


def test_hidden_library_falls_back_to_the_reference_and_says_so():
    code = r"""
import sys, logging, torch
sys.modules["vllm_ascend_ext._C_ascend_ext"] = None          # hide the compiled library
logging.basicConfig(level=logging.WARNING)
from vllm_ascend_ext.ops import _ext
from vllm_ascend_ext.ops.mla_prolog_k3 import npu_mla_prolog_v3_k3, mla_prolog_v3_k3_reference
g = torch.Generator().manual_seed(0)
a = [torch.randn(4, 32, generator=g), torch.randn(32, 24, generator=g), torch.randn(24, 2*96, generator=g),
     torch.randn(2, 96, 16, generator=g), torch.randn(32, 16, generator=g), torch.rand(24), torch.rand(16)]
c1, c2 = torch.zeros(2, 4, 1, 16), torch.zeros(2, 4, 1, 16)
idx = torch.tensor([0, 5, -1, 2])
q1, _ = npu_mla_prolog_v3_k3(*a, c1, cache_index=idx)
q2, _ = mla_prolog_v3_k3_reference(*a, c2, cache_index=idx)
assert not _ext.load() and not hasattr(torch.ops._C_ascend_ext, "npu_mla_prolog_v3_k3_x")
assert torch.equal(q1, q2) and torch.equal(c1, c2)
print("FALLBACK-OK", _ext.registered_ops())
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "FALLBACK-OK []" in proc.stdout, proc.stderr[-2000:]
    assert "compiled op library vllm_ascend_ext._C_ascend_ext is not available" in proc.stderr
