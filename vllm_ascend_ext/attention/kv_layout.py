"""How the plugin's backends lay K and V inside vLLM's per-layer KV cache.

vLLM 0.32 hands each layer a logical ``[num_blocks, KV_N, block_size, 2 * D]`` cache
whose block interior is contiguous (layout ``LBHNC``); one block is one page, possibly
padded in hybrid models (pages shared with other layers' state). The plugin reads each
block's bytes as two planes ``[2, block_size, KV_N, D]``: K plane first, then V plane.
Every block keeps its own bytes, so page sharing and block-wise KV transfer stay valid.

FIA and its cache writer take key and value each as *one contiguous region indexed by
block id* (torch_npu: "key、value是按照block_table中的索引在一片连续内存中排布", and
"不支持非连续的Tensor"; ATB writes its caches through contiguous memory). Seen as a run
of planes ``[P, block_size, KV_N, D]``, the cache memory holds block ``b``'s K plane at
plane ``F * b`` and its V plane at ``F * b + 1``, where ``F`` is the block stride in
planes (2 without padding). So ``key`` = planes ``[0, P)`` and ``value`` = planes
``[1, P + 1)`` are two contiguous tensors of the same shape, both indexed by the *plane
id* ``F * b``: the builder scales the block table and the slot mapping by ``F`` once per
step, and no layer ever sees a strided cache.
"""

from __future__ import annotations

import torch


class KVCacheLayoutError(ValueError):
    pass


def plane_factor(block_stride: int, plane: int) -> int:
    """Planes per block: the block stride (elements or bytes) over one K or V plane."""
    if plane <= 0 or block_stride % plane or block_stride // plane < 2:
        raise KVCacheLayoutError(
            f"a KV-cache block spans {block_stride} units, not a whole number (>= 2) of "
            f"{plane}-unit K/V planes: FIA cannot address its K and V planes by block id")
    return block_stride // plane


def spec_plane_factor(kv_cache_spec) -> int:
    """``plane_factor`` from a vLLM attention spec (its page, padded or not)."""
    plane = (kv_cache_spec.block_size * kv_cache_spec.num_kv_heads * kv_cache_spec.head_size
             * kv_cache_spec.dtype.itemsize)
    return plane_factor(kv_cache_spec.page_size_bytes, plane)


def plane_views(kv_cache: torch.Tensor, factor: int | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(key, value, F): contiguous ``[P, block_size, KV_N, D]`` views of the cache memory,
    block ``b``'s K and V planes at index ``F * b`` of each. ``factor``, when given (the
    builder's, from the spec), must match the cache's block stride."""
    if kv_cache.dim() != 4 or kv_cache.shape[-1] % 2:
        raise KVCacheLayoutError(
            f"expected a [num_blocks, KV_N, block_size, 2*D] cache, got {tuple(kv_cache.shape)}")
    nb, kvh, bs, two_d = kv_cache.shape
    d = two_d // 2
    plane = bs * kvh * d
    if nb and not kv_cache[0].is_contiguous():
        raise KVCacheLayoutError(
            "the KV-cache block interior must be contiguous (layout LBHNC); got strides "
            f"{kv_cache.stride()}")
    if nb > 1:
        found = plane_factor(kv_cache.stride(0), plane)
        if factor is not None and found != factor:
            raise KVCacheLayoutError(
                f"the cache's block stride is {found} planes, the builder scaled block ids "
                f"by {factor}")
        factor = found
    factor = factor or 2
    planes = factor * (nb - 1) + 1 if nb else 0
    size, stride = (planes, bs, kvh, d), (plane, kvh * d, d, 1)
    offset = kv_cache.storage_offset()
    key = kv_cache.as_strided(size, stride, offset)
    value = kv_cache.as_strided(size, stride, offset + plane)
    return key, value, factor


def plane_block_table(block_table: torch.Tensor, factor: int) -> torch.Tensor:
    """Block ids -> plane ids (int32, as FIA takes them)."""
    return (block_table * factor).to(torch.int32)


NULL_SLOT = 0  # slot 0 of vLLM's null block (block 0, reserved by its BlockPool, never read)


def plane_slots(slots: torch.Tensor, block_size: int, factor: int) -> torch.Tensor:
    """Token slots ``block * block_size + offset`` -> slots in the plane run (int32).
    A negative slot inside the step (vLLM marks model-drafted tokens past
    ``max_model_len`` and dummy-run tokens -1) becomes ``NULL_SLOT``: the NPU writer takes
    slots in ``[0, num_blocks * block_size - 1]`` only, and the null block is never read."""
    planes = (slots // block_size) * (factor * block_size) + slots % block_size
    return torch.where(slots >= 0, planes, NULL_SLOT).to(torch.int32)
