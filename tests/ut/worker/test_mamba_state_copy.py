"""The NPU runner's align-mode state copies (hybrid prefix caching), against explicit
loops written from vLLM 0.32's kernel semantics (``vllm/v1/worker/mamba_utils.py``):

- ``batch_memcpy`` (``batch_memcpy_kernel``): bytes copied address to address inside the
  registered allocations, a left-overlapping copy reading its source first; host address
  lists only; addresses outside the allocations refused;
- ``AlignSpecCopies`` (the fused pre-copy and post-copy kernels under speculation): per
  request and state, conv windows shifted by the accepted offset and recurrent states
  taken from the accepted column, decided on the device by the accepted counts; the
  accepted-count reset where the state stays in its column.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_ascend_ext.errors import AscendExtError
from vllm_ascend_ext.worker import mamba_state_copy as msc
from vllm_ascend_ext.worker.mamba_spec_copies import copy_state_blocks

# -- batch_memcpy --------------------------------------------------------------------------

N_BLOCKS, W, D, H, K = 6, 4, 8, 2, 4     # conv window W x dim D, recurrent H x K x K


def _hybrid_pages(dtype=torch.float32, seed=0, n_blocks=N_BLOCKS):
    """One allocation of ``n_blocks`` pages, each [conv block | recurrent block], as vLLM lays out a
    hybrid model's states: two strided views over the same bytes."""
    g = torch.Generator().manual_seed(seed)
    conv_n, rec_n = W * D, H * K * K
    raw = torch.randn(n_blocks * (conv_n + rec_n), generator=g).to(dtype)
    pages = raw.view(n_blocks, conv_n + rec_n)
    conv = pages[:, :conv_n].unflatten(1, (W, D))
    rec = pages[:, conv_n:].unflatten(1, (H, K, K))
    return raw, conv, rec


def _memmove_loop(buf: bytearray, copies):
    for src, dst, size in copies:
        data = bytes(buf[src:src + size])          # the kernel reads before it writes
        buf[dst:dst + size] = data


def _bytes(t: torch.Tensor) -> bytearray:
    return bytearray(t.contiguous().view(torch.uint8).numpy().tobytes())


def test_batch_memcpy_equals_a_byte_loop_over_hybrid_pages():
    raw, conv, rec = _hybrid_pages()
    msc.register_state_memory([conv, rec])
    base, item = raw.data_ptr(), raw.element_size()
    # (source, destination): a recurrent block to another page, a conv window shifted by
    # two tokens into another block, the same shift inside one block (overlap), a no-op
    copies = [(rec[1].data_ptr(), rec[4].data_ptr(), rec[1].numel() * item),
              (conv[2, 2:].data_ptr(), conv[5].data_ptr(), conv[2, 2:].numel() * item),
              (conv[3, 1:].data_ptr(), conv[3].data_ptr(), conv[3, 1:].numel() * item),
              (rec[0].data_ptr(), rec[0].data_ptr(), rec[0].numel() * item)]
    want = _bytes(raw)
    _memmove_loop(want, [(s - base, d - base, n) for s, d, n in copies])
    src, dst, sizes = (torch.tensor([c[i] for c in copies], dtype=dt)
                       for i, dt in ((0, torch.uint64), (1, torch.uint64), (2, torch.int32)))
    before = raw.clone()
    msc.batch_memcpy(src, dst, sizes, BLOCK_SIZE=1024)
    assert _bytes(raw) == want
    assert not torch.equal(raw, before)      # the copies changed something


def test_batch_memcpy_refuses_foreign_addresses_and_device_lists():
    raw, conv, rec = _hybrid_pages()
    msc.register_state_memory([conv, rec])
    outside = torch.zeros(64)
    lists = (torch.tensor([outside.data_ptr()], dtype=torch.uint64),
             torch.tensor([rec[0].data_ptr()], dtype=torch.uint64),
             torch.tensor([64], dtype=torch.int32))
    with pytest.raises(AscendExtError, match="outside the runner's 1 registered"):
        msc.batch_memcpy(*lists)
    end = raw.data_ptr() + raw.numel() * raw.element_size()
    with pytest.raises(AscendExtError, match="outside"):
        msc.batch_memcpy(torch.tensor([end - 8], dtype=torch.uint64), lists[1],
                         torch.tensor([16], dtype=torch.int32))
    with pytest.raises(AscendExtError, match="src_ptrs is on meta.*host"):
        msc.batch_memcpy(lists[0].to("meta"), *lists[1:])


def test_host_buffers_keep_both_sides_on_the_host():
    buf = msc.host_buffer(5, dtype=torch.uint64)
    buf.np[:2] = [7, 9]
    staged = buf.copy_to_gpu(2)
    assert staged.device.type == "cpu" and staged.tolist() == [7, 9]
    assert staged.data_ptr() == buf.cpu.data_ptr() and buf.gpu is buf.cpu   # no copy, no pin


# -- the fused copies under speculation -----------------------------------------------------

def _copy_loop(conv, rec, table, src_col, dst_col, bias, need):
    """vLLM's ``_copy_mamba_state_block`` per request: conv ``S[t[src], b:] ->
    S[t[dst], :W-b]`` (nothing when ``b >= W``), recurrent ``S[t[src+b]] -> S[t[dst]]``.
    ``conv`` is ``[N, W, D]`` (a DS cache passed transposed)."""
    width = conv.shape[1]
    for r in range(len(src_col)):
        if not need[r]:
            continue
        t, s, d, b = table[r], src_col[r], dst_col[r], bias[r]
        if b < width:
            window = conv[t[s], b:].clone()
            conv[t[d], :width - b] = window
        rec[t[d]] = rec[t[s + b]].clone()


def _tables(n: int, cols: int, seed: int = 0) -> np.ndarray:
    """Distinct blocks per request, shuffled (block ids are not in column order)."""
    ids = np.random.default_rng(n + seed).permutation(n * cols)
    return ids.reshape(n, cols)


def _states(n_blocks: int, layout: str, seed: int):
    """(conv cache as stored, its [N, W, D] view, recurrent cache): interleaved fp32 pages
    (SD), a DS conv cache ``[N, D, W]``, or a bf16 conv beside an fp32 recurrent state
    (the real model's dtypes) in separate allocations."""
    if layout == "pages":
        _, conv, rec = _hybrid_pages(seed=seed, n_blocks=n_blocks)
        return conv, conv, rec
    g = torch.Generator().manual_seed(seed)
    rec = torch.randn(n_blocks, H, K, K, generator=g)
    if layout == "ds":
        conv = torch.randn(n_blocks, D, W, generator=g)
        return conv, conv.transpose(1, 2), rec
    conv = torch.randn(n_blocks, W, D, generator=g).to(torch.bfloat16)
    return conv, conv, rec


LAYOUTS = ("pages", "ds", "bf16-conv")


@pytest.fixture(params=LAYOUTS)
def layout(request, monkeypatch):
    from vllm_ascend_ext.worker import mamba_spec_copies

    monkeypatch.setattr(mamba_spec_copies, "is_conv_state_dim_first",
                        lambda: request.param == "ds")
    return request.param


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, W + 1), st.integers(0, 2),
                          st.booleans()), min_size=1, max_size=3))
def test_copy_state_blocks_equals_the_kernel_loop(layout, rows):
    n, cols = len(rows), 8
    conv, view, rec = _states(n * cols, layout, seed=n)
    table = _tables(n, cols)
    src = [s for s, _, _, _ in rows]
    bias = [b for _, b, _, _ in rows]
    dst = [d for _, _, d, _ in rows]
    need = [x for *_, x in rows]
    want_view, want_rec = view.clone(), rec.clone()
    _copy_loop(want_view, want_rec, table, src, dst, bias, need)
    copy_state_blocks([(conv, True), (rec, False)], torch.as_tensor(table, dtype=torch.int64),
                      torch.tensor(src), torch.tensor(dst), torch.tensor(bias),
                      torch.tensor(need))
    torch.testing.assert_close(view, want_view, rtol=0, atol=0)
    torch.testing.assert_close(rec, want_rec, rtol=0, atol=0)
    if any(need[r] and (dst[r] != src[r] or bias[r]) for r in range(n)):
        fresh_conv, _, fresh_rec = _states(n * cols, layout, seed=n)
        assert not (torch.equal(conv, fresh_conv) and torch.equal(rec, fresh_rec))


SPEC_BLOCKS = 3


def _context(n: int, block: int, cols: int, layout: str = "pages"):
    """An ``AlignSpecCopies`` over two mamba groups (one GDN layer each, their own block
    tables), as vLLM's hybrid allocator groups a model's layers."""
    from types import SimpleNamespace

    from vllm.model_executor.layers.mamba.mamba_utils import (
        get_conv_copy_spec,
        get_temporal_copy_spec,
    )
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, MambaSpec

    from vllm_ascend_ext.worker.mamba_spec_copies import AlignSpecCopies

    spec = MambaSpec(block_size=block, shapes=((W, D), (H, K, K)),
                     dtypes=(torch.float32, torch.float32),
                     mamba_type=MambaAttentionBackendEnum.GDN_ATTN, mamba_cache_mode="align",
                     num_speculative_blocks=SPEC_BLOCKS)
    config = KVCacheConfig(num_blocks=n * cols, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec(["l0"], spec),
                                            KVCacheGroupSpec(["l1"], spec)])
    funcs = {spec.mamba_type: (get_conv_copy_spec, get_temporal_copy_spec)}
    layers = [_states(n * cols, layout, seed=n + block + i) for i in range(2)]
    tables = [_tables(n, cols, seed=i) for i in range(2)]
    ctx = AlignSpecCopies.create(n, config, funcs, torch.device("cpu"), msc.host_buffer)
    ctx.host_tables = lambda: tables
    ctx.initialize_from_forward_context(
        config, {f"l{i}": SimpleNamespace(kv_cache=[c, r]) for i, (c, _, r) in enumerate(layers)},
        funcs, [torch.as_tensor(t) for t in tables])
    return ctx, [(v, r) for _, v, r in layers], tables


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _snapshot(layers):
    return [(v.clone(), r.clone()) for v, r in layers]


def _assert_states(layers, want):
    for (v, r), (wv, wr) in zip(layers, want):
        torch.testing.assert_close(v, wv, rtol=0, atol=0)
        torch.testing.assert_close(r, wr, rtol=0, atol=0)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.sampled_from([4, 8]),
       st.lists(st.tuples(st.integers(0, 40), st.integers(0, SPEC_BLOCKS), st.integers(0, 3)),
                min_size=1, max_size=4))
def test_post_copy_equals_the_kernel_decisions(layout, block, reqs):
    """Verify rows (1 + k tokens, k drafts, ``a`` accepted of ``k + 1``): vLLM's post-copy
    decision per request, written out, against the device-decided copies."""
    n = len(reqs)
    cols = _cdiv(40 + 1 + SPEC_BLOCKS, block) + SPEC_BLOCKS + 1
    ctx, layers, tables = _context(n, block, cols, layout)
    computed = [c for c, _, _ in reqs]
    drafts = [k for _, k, _ in reqs]
    accepted = [min(a, k) + 1 for _, k, a in reqs]
    scheduled = [1 + k for k in drafts]
    state_idx = [_cdiv(c + s, block) - 1 for c, s in zip(computed, scheduled)]
    for buf, values in ((ctx.mamba_state_idx_buf, state_idx),
                        (ctx.num_computed_tokens_buf, computed),
                        (ctx.num_scheduled_tokens_buf, scheduled),
                        (ctx.num_draft_tokens_buf, drafts)):
        buf.np[:n] = values
    want = _snapshot(layers)
    want_out = list(accepted)
    for r in range(n):
        running = computed[r] + scheduled[r] - drafts[r]
        aligned = (running + accepted[r] - 1) // block * block
        if aligned < running:
            continue
        bias, dest = aligned - running, aligned // block - 1
        if dest == state_idx[r]:
            want_out[r] = 1
            if bias == 0:
                continue
        for (wv, wr), table in zip(want, tables):
            _copy_loop(wv, wr, table[r:r + 1], [state_idx[r]], [dest], [bias], [True])
    acc = torch.tensor(accepted, dtype=torch.int32)
    ctx.run_fused_postprocess(n, acc, None, None, None, None)
    _assert_states(layers, want)
    assert ctx.num_accepted_tokens_out[:n].tolist() == want_out


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.sampled_from([4, 8]),
       st.lists(st.tuples(st.integers(-1, 5), st.integers(0, 5), st.integers(0, SPEC_BLOCKS)),
                min_size=1, max_size=4))
def test_pre_copy_moves_each_state_to_its_new_column(layout, block, reqs):
    n = len(reqs)
    ctx, layers, tables = _context(n, block, 10, layout)
    src = [s for s, _, _ in reqs]
    dst = [d for _, d, _ in reqs]
    bias = [b for *_, b in reqs]
    ctx.mamba_state_idx_buf.np[:n] = dst
    ctx.precopy_src_col_buf.np[:n] = src
    ctx.precopy_token_bias_buf.np[:n] = bias
    fresh = _snapshot(layers)
    want = _snapshot(layers)
    moved = [r for r in range(n) if src[r] >= 0 and src[r] != dst[r]]
    for r in moved:
        for (wv, wr), table in zip(want, tables):
            _copy_loop(wv, wr, table[r:r + 1], [src[r]], [dst[r]], [bias[r]], [True])
    ctx.run_fused_precopy(n, None, None, None, None)
    _assert_states(layers, want)
    if moved:     # the loop is not vacuous: the example moved some state
        assert any(not (torch.equal(v, fv) and torch.equal(r, fr))
                   for (v, r), (fv, fr) in zip(layers, fresh))


def test_a_layer_with_an_unknown_copy_function_is_refused():
    from types import SimpleNamespace

    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, MambaSpec

    ctx, layers, _ = _context(1, 4, 4)
    ctx.is_initialized, ctx.states, ctx.state_groups = False, [], []
    spec = MambaSpec(block_size=4, shapes=((W, D),), dtypes=(torch.float32,),
                     mamba_type=MambaAttentionBackendEnum.GDN_ATTN, mamba_cache_mode="align")
    config = KVCacheConfig(num_blocks=4, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)])

    def shift_copy(*args):
        return None
    with pytest.raises(AscendExtError, match="layer l0 has 1 state tensors.*shift_copy"):
        ctx.initialize_from_forward_context(
            config, {"l0": SimpleNamespace(kv_cache=[layers[0][1]])},
            {spec.mamba_type: (shift_copy,)}, [])
