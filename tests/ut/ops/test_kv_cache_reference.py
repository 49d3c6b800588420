"""The paged KV-cache write reference against an explicit loop."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend_ext.attention.kv_layout import plane_slots, plane_views
from vllm_ascend_ext.ops.kv_cache import ScatterKvCacheError, npu_scatter_pa_kv_cache


@pytest.mark.parametrize("bs", [16, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("strided", [False, True])
def test_writes_each_token_at_its_slot(bs, dtype, slot_dtype, strided):
    torch.manual_seed(0)
    nb, nkv, d, T = 5, 2, 64, 23
    key, value = torch.randn(T, nkv, d).to(dtype), torch.randn(T, nkv, d).to(dtype)
    slots = torch.randperm(nb * bs)[:T].to(slot_dtype)
    kc, vc = torch.zeros(nb, bs, nkv, d, dtype=dtype), torch.zeros(nb, bs, nkv, d, dtype=dtype)
    if strided:  # caches that are views with gaps between blocks (no row-order copy)
        kc = torch.zeros(nb, bs + 3, nkv, d, dtype=dtype)[:, :bs]
        vc = torch.zeros(nb, bs + 3, nkv, d, dtype=dtype)[:, :bs]
    npu_scatter_pa_kv_cache(key, value, kc, vc, slots)
    exp_k, exp_v = torch.zeros_like(kc), torch.zeros_like(vc)
    for t in range(T):
        s = int(slots[t])
        exp_k[s // bs, s % bs] = key[t]
        exp_v[s // bs, s % bs] = value[t]
    assert torch.equal(kc, exp_k) and torch.equal(vc, exp_v)


def test_padding_slots_are_refused_not_skipped():
    """The documented range is [0, num_blocks * block_size - 1]: no -1 padding."""
    kc = torch.zeros(2, 16, 1, 8)
    with pytest.raises(ScatterKvCacheError, match=r"slots must lie in \[0, 31\]"):
        npu_scatter_pa_kv_cache(torch.ones(2, 1, 8), torch.ones(2, 1, 8), kc, kc.clone(),
                                torch.tensor([3, -1], dtype=torch.int32))


def test_writes_through_the_plugin_cache_views():
    """Writes land in vLLM's per-layer cache memory, K plane then V plane per block,
    through contiguous views addressed by plane slots."""
    nb, nkv, bs, d = 3, 2, 16, 64
    kv_cache = torch.zeros(nb, nkv, bs, 2 * d)  # vLLM's logical per-layer shape
    kc, vc, factor = plane_views(kv_cache)
    assert factor == 2 and kc.is_contiguous() and vc.is_contiguous()
    assert kc.shape == vc.shape == (2 * nb - 1, bs, nkv, d)
    key, value = torch.ones(1, nkv, d), 2 * torch.ones(1, nkv, d)
    slots = plane_slots(torch.tensor([bs + 5]), bs, factor)
    assert slots.tolist() == [2 * bs + 5] and slots.dtype == torch.int32
    npu_scatter_pa_kv_cache(key, value, kc, vc, slots)
    block = kv_cache[1].reshape(2, bs, nkv, d)
    assert torch.all(block[0, 5] == 1) and torch.all(block[1, 5] == 2)
    assert kv_cache.sum() == (1 + 2) * nkv * d  # nothing else touched


def test_plane_views_of_a_padded_page():
    """Hybrid models pad attention pages: the block stride is then F > 2 planes."""
    nb, nkv, bs, d, pad_planes = 4, 2, 16, 8, 1
    plane = bs * nkv * d
    raw = torch.arange(nb * (2 + pad_planes) * plane, dtype=torch.float32)
    kv_cache = raw.as_strided((nb, nkv, bs, 2 * d), ((2 + pad_planes) * plane, bs * 2 * d,
                                                    2 * d, 1))
    kc, vc, factor = plane_views(kv_cache)
    assert factor == 3 and kc.is_contiguous() and vc.is_contiguous()
    for b in range(nb):  # plane id F*b addresses block b's K and V planes
        block = kv_cache[b].reshape(2, bs, nkv, d)
        assert torch.equal(kc[factor * b], block[0]) and torch.equal(vc[factor * b], block[1])
    # -1 inside a step (drafts past max_model_len, dummy runs) -> the null block's slot 0
    assert plane_slots(torch.tensor([-1, 0, bs + 3]), bs, factor).tolist() == [0, 0, 3 * bs + 3]


@pytest.mark.parametrize("change,needle", [
    (dict(slot_mapping=torch.tensor([0.0, 1.0])), "int32 or int64"),
    (dict(slot_mapping=torch.tensor([0], dtype=torch.int32)), "2 tokens but 1"),
    (dict(key_cache=torch.zeros(2, 16, 3, 64)), "key_cache must be"),
    (dict(value_cache=torch.zeros(2, 16, 2, 64, dtype=torch.float16)), "dtype"),
    (dict(value=torch.zeros(2, 2, 64, dtype=torch.float16),
          value_cache=torch.zeros(2, 16, 2, 64, dtype=torch.float16)),
     "value dtype torch.float16 must equal key dtype"),
])
def test_rejects_bad_arguments(change, needle):
    kwargs = dict(key=torch.zeros(2, 2, 64), value=torch.zeros(2, 2, 64),
                  key_cache=torch.zeros(2, 16, 2, 64), value_cache=torch.zeros(2, 16, 2, 64),
                  slot_mapping=torch.tensor([0, 1], dtype=torch.int32))
    kwargs.update(change)
    with pytest.raises(ScatterKvCacheError, match=needle):
        npu_scatter_pa_kv_cache(**kwargs)
