"""The compiled emulation kernels (``_C_ascend_ext.emu_*``) against their Python references.

Same batches as the reference tests (decodes, speculative verifies, chunked prefill on
cached prefixes, fresh prefills; GQA ratios, block sizes, both paged layouts, fp32 and
bf16, strided inputs), every sparse mode the reference takes, the thread count, the
switch that forces the references, and the fallback without the library.
README's install builds the library: these tests fail (not skip) when it is missing.
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.ut.dense import emulation_path
from tests.ut.ops.test_fia_reference import _batch
from vllm_ascend_ext.attention.kv_layout import plane_block_table, plane_views
from vllm_ascend_ext.errors import AscendExtError
from vllm_ascend_ext.ops import compiled
from vllm_ascend_ext.ops import fia as fia_mod
from vllm_ascend_ext.ops.fia import causal_mask_2048, fia_emulated, fia_reference

# fp32: accumulation order only; bf16: one rounding of the output may land on the other side.
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2),
       torch.float16: dict(atol=2e-3, rtol=2e-3)}


@contextlib.contextmanager
def _no_fallback(module, name):
    """Within the block the compiled kernel must run: the module's reference raises."""
    real = getattr(module, name)

    def refuse(*a, **k):
        raise AssertionError(f"{name} ran: the compiled kernel was expected")

    setattr(module, name, refuse)
    try:
        with emulation_path("compiled"):
            yield
    finally:
        setattr(module, name, real)


def _both(query, key, value, **kw):
    """(compiled, reference) results of one call."""
    with _no_fallback(fia_mod, "fia_reference"):
        got = fia_emulated(query, key, value, **kw)
    return got, fia_reference(query, key, value, **kw)


def _assert_same(got, ref, dtype, lse):
    (o1, l1), (o2, l2) = got, ref
    assert o1.dtype == o2.dtype == dtype and o1.shape == o2.shape
    torch.testing.assert_close(o1.float(), o2.float(), **TOL[dtype])
    if lse:
        torch.testing.assert_close(l1, l2, atol=1e-4, rtol=1e-4)
    else:
        assert l1.shape == l2.shape == (0,)


def test_readme_install_built_the_kernels():
    assert compiled.emulation_kernel("emu_fused_infer_attention_score", torch.device("cpu"))
    assert compiled.vector_path() in ("avx2", "default")


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    kinds=st.lists(st.sampled_from(["decode", "spec", "chunk", "prefill"]), min_size=1, max_size=7),
    gqa=st.sampled_from([1, 2, 4, 8]),
    nkv=st.sampled_from([1, 2, 4]),
    d=st.sampled_from([64, 128, 256]),
    bs=st.sampled_from([16, 32, 128]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    layout=st.sampled_from(["BnBsH", "BnNBsD"]),
    mode=st.sampled_from([3, 0]),
    lse=st.booleans(),
    strided_q=st.booleans(),
)
def test_compiled_fia_equals_reference(seed, kinds, gqa, nkv, d, bs, dtype, layout, mode, lse,
                                       strided_q):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    if d == 256:   # FIA's TND split-fuse path: GQA and a 3-D cache (fia_checks)
        gqa, layout = max(gqa, 2), "BnBsH"
    nq = nkv * gqa
    lens, qs, _, _, kc, vc, table = _batch(rng, kinds, nq, nkv, d, bs, dtype)
    query = torch.cat(qs).to(dtype)
    if strided_q:  # a view into a wider projection output: token and head strides differ
        query = torch.cat([query, torch.randn_like(query)], dim=-1)[..., :d]
    if layout == "BnBsH":
        key, value = kc.view(kc.shape[0], bs, -1), vc.view(vc.shape[0], bs, -1)
    else:
        key, value = kc.transpose(1, 2).contiguous(), vc.transpose(1, 2).contiguous()
    cu = torch.tensor([lq for lq, _ in lens]).cumsum(0).tolist()
    kw = dict(atten_mask=causal_mask_2048() if mode == 3 else None, actual_seq_lengths=cu,
              actual_seq_lengths_kv=[lkv for _, lkv in lens], block_table=table, num_heads=nq,
              num_key_value_heads=nkv, scale=d**-0.5, input_layout="TND", sparse_mode=mode,
              block_size=bs, softmax_lse_flag=lse)
    _assert_same(*_both(query, key, value, **kw), dtype, lse)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_plane_views_of_a_padded_hybrid_page(dtype):
    """The backend's own cache views: K and V planes of a page padded to 3 planes."""
    torch.manual_seed(5)
    nb, nkv, bs, d = 7, 2, 16, 64
    page = torch.randn(nb, 3 * bs * nkv * d).to(dtype)  # block stride = 3 planes
    kv_cache = page.as_strided((nb, nkv, bs, 2 * d), (page.stride(0), bs * 2 * d, 2 * d, 1))
    key, value, factor = plane_views(kv_cache)
    assert factor == 3
    table = plane_block_table(torch.tensor([[4, 1], [6, 0], [2, 5]]), factor)
    q = torch.randn(1 + 3 + 20, 4, d).to(dtype)
    kw = dict(atten_mask=causal_mask_2048(), actual_seq_lengths=[1, 4, 24],
              actual_seq_lengths_kv=[30, 3, 32], block_table=table, num_heads=4,
              num_key_value_heads=nkv, scale=0.125, input_layout="TND", sparse_mode=3,
              block_size=bs, softmax_lse_flag=True)
    _assert_same(*_both(q, key.view(key.shape[0], bs, -1), value.view(value.shape[0], bs, -1),
                        **kw), dtype, True)


@pytest.mark.parametrize("mode,pre,nxt", [(2, 2147483647, 2147483647), (4, 3, 0), (4, 40, 2),
                                          (0, 5, 1)])
def test_other_sparse_modes_and_explicit_mask(mode, pre, nxt):
    torch.manual_seed(6)
    rng = random.Random(6)
    lens, qs, _, _, kc, vc, table = _batch(rng, ["chunk", "prefill", "decode", "spec"], 4, 2, 64,
                                           16, torch.float32)
    mask = causal_mask_2048() if mode else (torch.rand(2048, 2048) < 0.3)
    cu = torch.tensor([lq for lq, _ in lens]).cumsum(0).tolist()
    kw = dict(atten_mask=mask, actual_seq_lengths=cu, actual_seq_lengths_kv=[k for _, k in lens],
              block_table=table, num_heads=4, num_key_value_heads=2, scale=0.125,
              input_layout="TND", sparse_mode=mode, pre_tokens=pre, next_tokens=nxt,
              block_size=16, softmax_lse_flag=True)
    got, ref = _both(torch.cat(qs), kc.view(kc.shape[0], 16, -1), vc.view(vc.shape[0], 16, -1), **kw)
    _assert_same(got, ref, torch.float32, True)
    assert torch.isinf(ref[1]).any() == torch.isinf(got[1]).any()  # same fully masked rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_kv_and_rows_that_see_nothing(dtype):
    torch.manual_seed(7)
    q_lens, kv_lens = [3, 6, 1], [3, 2, 300]  # request 1: 4 of its 6 rows see no key
    q = torch.randn(sum(q_lens), 8, 128).to(dtype)
    k, v = torch.randn(sum(kv_lens), 2, 128).to(dtype), torch.randn(sum(kv_lens), 2, 128).to(dtype)
    kw = dict(atten_mask=causal_mask_2048(), actual_seq_lengths=[3, 9, 10],
              actual_seq_lengths_kv=[3, 5, 305], num_heads=8, num_key_value_heads=2,
              scale=128**-0.5, input_layout="TND", sparse_mode=3, softmax_lse_flag=True)
    got, ref = _both(q, k, v, **kw)
    _assert_same(got, ref, dtype, True)
    assert torch.all(got[0][3:7] == 0) and torch.all(torch.isinf(got[1][3:7]))


def test_kernel_runs_its_region_on_the_torch_thread_setting():
    """The kernel is built with threading and takes the thread setting: its parallel
    region runs one body per thread (counted in the region, so a busy machine, where one
    thread may take every item, reads the same), and the threads' shared work split gives
    the reference's result; one thread, one body (the control). The test workers run one
    thread each (tests/conftest.py), so this is the kernels' multi-threaded check."""
    old = torch.get_num_threads()
    q = torch.randn(64, 4, 64)
    k, v = torch.randn(64 * 128, 2, 64), torch.randn(64 * 128, 2, 64)
    kw = dict(atten_mask=causal_mask_2048(), actual_seq_lengths=list(range(1, 65)),
              actual_seq_lengths_kv=[128 * (i + 1) for i in range(64)], num_heads=4,
              num_key_value_heads=2, scale=0.125, input_layout="TND", sparse_mode=3)
    seen = {}
    try:
        for n in (2, 1):
            torch.set_num_threads(n)
            got, ref = _both(q, k, v, **kw)
            seen[n] = compiled.last_kernel_threads()
            _assert_same(got, ref, torch.float32, False)
    finally:
        torch.set_num_threads(old)
    assert seen == {2: 2, 1: 1}


def test_the_switch_forces_the_reference_and_bad_values_are_named(monkeypatch):
    calls = []
    real = fia_mod.fia_reference
    monkeypatch.setattr(fia_mod, "fia_reference", lambda *a, **k: calls.append(1) or real(*a, **k))
    q, k, v = torch.randn(2, 2, 64), torch.randn(2, 1, 64), torch.randn(2, 1, 64)
    kw = dict(actual_seq_lengths=[2], actual_seq_lengths_kv=[2], num_heads=2,
              num_key_value_heads=1, scale=0.125, input_layout="TND")
    with emulation_path("compiled"):
        fia_mod.npu_fused_infer_attention_score(q, k, v, **kw)
    assert calls == []
    with emulation_path("reference"):
        fia_mod.npu_fused_infer_attention_score(q, k, v, **kw)
    assert calls == [1]
    monkeypatch.setenv("ASCEND_EXT_PY_REFERENCE", "maybe")
    with pytest.raises(AscendExtError, match="ASCEND_EXT_PY_REFERENCE='maybe'"):
        fia_mod.npu_fused_infer_attention_score(q, k, v, **kw)


def test_a_block_id_outside_the_cache_is_an_error_not_a_wild_read():
    q, k, v = torch.randn(1, 2, 64), torch.randn(4, 16, 64), torch.randn(4, 16, 64)
    kw = dict(actual_seq_lengths=[1], actual_seq_lengths_kv=[20], num_heads=2,
              num_key_value_heads=1, scale=0.125, input_layout="TND", block_size=16,
              block_table=torch.tensor([[1, 9]], dtype=torch.int32))
    with emulation_path("compiled"), pytest.raises(RuntimeError, match=r"block_table\[0\]\[1\] = 9"):
        fia_emulated(q, k, v, **kw)


def _run_child(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, **env))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_portable_vector_path_equals_the_avx2_path(monkeypatch, dtype):
    torch.manual_seed(0)
    lens, qs, _, _, kc, vc, table = _batch(random.Random(0), ["decode", "chunk", "spec", "prefill"],
                                           8, 2, 128, 16, dtype)
    kw = dict(atten_mask=causal_mask_2048(),
              actual_seq_lengths=torch.tensor([a for a, _ in lens]).cumsum(0).tolist(),
              actual_seq_lengths_kv=[b for _, b in lens], block_table=table, num_heads=8,
              num_key_value_heads=2, scale=0.1, input_layout="TND", sparse_mode=3,
              block_size=16, softmax_lse_flag=True)
    args = (torch.cat(qs).to(dtype), kc.view(kc.shape[0], 16, -1), vc.view(vc.shape[0], 16, -1))
    native_path = compiled.vector_path()
    native = _both(*args, **kw)[0]
    monkeypatch.setenv("ASCEND_EXT_EMU_ISA", "default")
    assert compiled.vector_path() == "default"
    portable, ref = _both(*args, **kw)
    _assert_same(portable, ref, dtype, True)
    _assert_same(portable, native, dtype, True)
    if native_path == "avx2":  # two different builds of one body, not one path twice
        assert not torch.equal(portable[1], native[1]) or not torch.equal(portable[0], native[0])


def test_hidden_library_runs_the_reference():
    code = r"""
import sys, torch
sys.modules["vllm_ascend_ext._C_ascend_ext"] = None          # hide the compiled library
from vllm_ascend_ext.ops import compiled
from vllm_ascend_ext.ops.fia import fia_emulated, fia_reference
q, k, v = torch.randn(3, 2, 64), torch.randn(5, 1, 64), torch.randn(5, 1, 64)
kw = dict(actual_seq_lengths=[1, 3], actual_seq_lengths_kv=[2, 5], num_heads=2,
          num_key_value_heads=1, scale=0.125, input_layout="TND")
assert compiled.emulation_kernel("emu_fused_infer_attention_score", q.device) is None
assert torch.equal(fia_emulated(q, k, v, **kw)[0], fia_reference(q, k, v, **kw)[0])
print("FALLBACK-OK", compiled.vector_path(), compiled.last_kernel_threads())
"""
    proc = _run_child(code)
    assert "FALLBACK-OK None 0" in proc.stdout, proc.stderr[-2000:]


def test_emulated_platform_uses_the_compile_cache_that_loads():
    from vllm_ascend_ext.platform.config_hooks import compile_cache_that_loads

    env: dict[str, str] = {}
    assert "cannot load its own AOT compile cache" in compile_cache_that_loads(env)
    assert env == {"VLLM_USE_AOT_COMPILE": "0"}
    chosen = {"VLLM_USE_AOT_COMPILE": "1"}  # the user's choice stands
    assert compile_cache_that_loads(chosen) is None and chosen == {"VLLM_USE_AOT_COMPILE": "1"}


# ----------------------------------------------------- the Gated-DeltaNet recurrence
@settings(max_examples=30, deadline=None)
@given(lens=st.lists(st.integers(0, 8), min_size=1, max_size=5).filter(any),
       nk=st.sampled_from([1, 2]), rep=st.sampled_from([1, 2, 4]),
       dk=st.sampled_from([5, 8, 64, 128]), dv=st.sampled_from([3, 16, 64]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       state_dtype=st.sampled_from([torch.float32, torch.bfloat16]), with_g=st.booleans(),
       use_accepted=st.booleans(), strided=st.booleans(), seed=st.integers(0, 2**16),
       data=st.data())
def test_compiled_gdn_recurrence_equals_reference(lens, nk, rep, dk, dv, dtype, state_dtype,
                                                  with_g, use_accepted, strided, seed, data):
    from vllm_ascend_ext.ops.gdn_recurrent import (
        recurrent_gated_delta_rule_emulated,
        recurrent_gated_delta_rule_reference,
    )

    gen = torch.Generator().manual_seed(seed)
    t, nv = sum(lens), nk * rep
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    q = torch.nn.functional.normalize(r(t, nk, dk), dim=-1).to(dtype)
    k = torch.nn.functional.normalize(r(t, nk, dk), dim=-1).to(dtype)
    v, beta = r(t, nv, dv).to(dtype), torch.sigmoid(r(t, nv)).to(dtype)
    g = -torch.nn.functional.softplus(r(t, nv)) if with_g else None
    n_slots = t + 3
    slots = torch.randperm(n_slots, generator=gen)[:t].to(torch.int32)
    accepted = (torch.tensor([data.draw(st.integers(1, max(n, 1))) for n in lens],
                             dtype=torch.int32) if use_accepted else None)
    if strided:  # hybrid pages: the recurrent state is a strided view (conv state beside it)
        page = r(n_slots, nv * dv * dk + 40).to(state_dtype)
        state = page[:, 40:].view(n_slots, nv, dv, dk)
    else:
        state = r(n_slots, nv, dv, dk).to(state_dtype)
    ref_state = state.clone()
    kw = dict(beta=beta, scale=dk**-0.5, actual_seq_lengths=torch.tensor(lens, dtype=torch.int32),
              ssm_state_indices=slots, num_accepted_tokens=accepted, g=g)
    from vllm_ascend_ext.ops import gdn_recurrent

    with _no_fallback(gdn_recurrent, "recurrent_gated_delta_rule_reference"):
        got = recurrent_gated_delta_rule_emulated(q, k, v, state, **kw)
    want = recurrent_gated_delta_rule_reference(q, k, v, ref_state, **kw)
    tol = TOL[torch.bfloat16 if torch.bfloat16 in (dtype, state_dtype) else torch.float32]
    assert got.dtype == want.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), **tol)
    torch.testing.assert_close(state.float(), ref_state.float(), **tol)
    untouched = sorted(set(range(n_slots)) - set(slots.tolist()))
    assert torch.equal(state[untouched], ref_state[untouched])


def test_compiled_gdn_recurrence_refuses_a_slot_outside_the_state():
    """The kernel checks its slots (no wild write); the wrapper never hands it such a
    slot: the reference runs and fails as it always did."""
    from vllm_ascend_ext.ops.gdn_recurrent import recurrent_gated_delta_rule_emulated

    q = k = torch.nn.functional.normalize(torch.randn(2, 1, 8), dim=-1)
    v, state, beta = torch.randn(2, 1, 8), torch.zeros(3, 1, 8, 8), torch.rand(2, 1)
    kernel = compiled.emulation_kernel("emu_recurrent_gated_delta_rule", q.device)
    with pytest.raises(RuntimeError, match="slot 7 outside"):
        kernel(q, k, v, state, beta, None, 0.3, [0], [2], [0, 7], [0])
    with emulation_path("compiled"), pytest.raises(IndexError):
        recurrent_gated_delta_rule_emulated(
            q, k, v, state, beta=beta, scale=0.3,
            actual_seq_lengths=torch.tensor([2], dtype=torch.int32),
            ssm_state_indices=torch.tensor([0, 7], dtype=torch.int32))


def test_gdn_requests_sharing_a_slot_take_the_reference():
    """Two requests writing one slot would race in the parallel kernel: the wrapper sees
    it on the host lists and runs the reference, whose order is defined."""
    from vllm_ascend_ext.ops.gdn_recurrent import (
        recurrent_gated_delta_rule_emulated,
        recurrent_gated_delta_rule_reference,
    )

    torch.manual_seed(9)
    q = k = torch.nn.functional.normalize(torch.randn(4, 1, 8), dim=-1)
    v, beta = torch.randn(4, 2, 8), torch.rand(4, 2)
    state = torch.randn(6, 2, 8, 8)
    ref_state = state.clone()
    kw = dict(beta=beta, scale=0.3, actual_seq_lengths=torch.tensor([2, 2], dtype=torch.int32),
              ssm_state_indices=torch.tensor([0, 1, 1, 3], dtype=torch.int32))
    with emulation_path("compiled"):
        got = recurrent_gated_delta_rule_emulated(q, k, v, state, **kw)
    want = recurrent_gated_delta_rule_reference(q, k, v, ref_state, **kw)
    assert torch.equal(got, want) and torch.equal(state, ref_state)


def test_fia_key_with_a_strided_last_dimension_takes_the_reference():
    q = torch.randn(2, 2, 64)
    k, v = torch.randn(2, 1, 128)[..., ::2], torch.randn(2, 1, 64)
    kw = dict(actual_seq_lengths=[2], actual_seq_lengths_kv=[2], num_heads=2,
              num_key_value_heads=1, scale=0.125, input_layout="TND")
    with emulation_path("compiled"):
        got = fia_emulated(q, k, v, **kw)[0]
    assert torch.equal(got, fia_reference(q, k, v, **kw)[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("gap", [0, 3])  # contiguous caches; blocks strided apart
def test_compiled_cache_write_equals_reference_and_a_loop(dtype, slot_dtype, gap):
    from vllm_ascend_ext.ops import kv_cache as kv_mod

    torch.manual_seed(1)
    nb, bs, nkv, d, T = 6, 16, 2, 64, 37
    key, value = torch.randn(T, nkv, d).to(dtype), torch.randn(T, nkv, d).to(dtype)
    slots = torch.randperm(nb * bs)[:T].to(slot_dtype)

    def caches():
        return tuple(torch.randn(nb, bs + gap, nkv, d).to(dtype)[:, :bs] for _ in range(2))

    torch.manual_seed(2)
    kc, vc = caches()
    torch.manual_seed(2)
    rk, rv = caches()
    exp_k, exp_v = rk.clone(), rv.clone()
    with _no_fallback(kv_mod, "scatter_pa_kv_cache_reference"):
        kv_mod.npu_scatter_pa_kv_cache(key, value, kc, vc, slots)
    kv_mod.scatter_pa_kv_cache_reference(key, value, rk, rv, slots, cache_mode="Norm")
    for t in range(T):
        s = int(slots[t])
        exp_k[s // bs, s % bs], exp_v[s // bs, s % bs] = key[t], value[t]
    assert torch.equal(kc, rk) and torch.equal(vc, rv)
    assert torch.equal(kc, exp_k) and torch.equal(vc, exp_v)


def test_compiled_cache_write_refuses_a_padding_slot_and_writes_nothing():
    from vllm_ascend_ext.ops import kv_cache as kv_mod

    kc, vc = torch.zeros(2, 16, 1, 64), torch.zeros(2, 16, 1, 64)
    with _no_fallback(kv_mod, "scatter_pa_kv_cache_reference"), pytest.raises(
            kv_mod.ScatterKvCacheError, match=r"slots must lie in \[0, 31\].*\[2\] = 32"):
        kv_mod.npu_scatter_pa_kv_cache(torch.ones(3, 1, 64), torch.ones(3, 1, 64), kc, vc,
                                       torch.tensor([3, 4, 32], dtype=torch.int32))
    assert not kc.any() and not vc.any()


def test_cache_write_from_strided_rows_is_still_exact():
    """Token rows that are not contiguous (a split of a fused projection) are the
    reference's: the kernel copies whole rows."""
    from vllm_ascend_ext.ops import kv_cache as kv_mod

    key = torch.randn(4, 2, 128)[:, :, :64]
    kc, vc = torch.zeros(2, 16, 2, 64), torch.zeros(2, 16, 2, 64)
    with emulation_path("compiled"):
        kv_mod.npu_scatter_pa_kv_cache(key, key, kc, vc, torch.tensor([0, 5, 17, 31]))
    assert torch.equal(kc[0, 5], key[1]) and torch.equal(vc[1, 15], key[3])
