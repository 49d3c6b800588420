"""Paged KV-cache write: ``torch_npu._npu_reshape_and_cache`` (ATB ReshapeAndCache).

The write that vllm-ascend pairs with FIA (``attention_v1.py``, ``device_op.py``):

    torch_npu._npu_reshape_and_cache(key=key, value=value, key_cache=key_cache,
                                     value_cache=value_cache, slot_indices=slots)

Semantics mirrored here (ND cache format):
- ``key``/``value``: [T, KV_N, D] (fp16/bf16; int8 for quantized caches);
- ``key_cache``/``value_cache``: [num_blocks, block_size, KV_N, D], written in
  place: token ``t`` goes to block ``slot // block_size``, row ``slot % block_size``;
- ``slot_indices``: **int32** [T] (ATB ReshapeAndCache's ``slot_mapping`` is int32;
  the keyword was ``slot_mapping`` before CANN 9.1, ``slot_indices`` since);
- negative slots (vLLM's padding slot -1) are skipped [I: ATB kernel and vLLM's
  PAD_SLOT_ID convention]; duplicate slots are undefined.
Returns None. The emulation also accepts fp32 (documented relaxation).
"""

from __future__ import annotations

import torch

from vllm_ascend_ext.ops._dispatch import pick, torch_npu_module

_DTYPES = (torch.float16, torch.bfloat16, torch.int8, torch.float32)


class ReshapeAndCacheError(ValueError):
    pass


def _check(key, value, key_cache, value_cache, slot_indices) -> None:
    name = "_npu_reshape_and_cache"
    if slot_indices.dtype != torch.int32 or slot_indices.dim() != 1:
        raise ReshapeAndCacheError(
            f"{name}: slot_indices must be int32 [T], got {slot_indices.dtype} "
            f"{tuple(slot_indices.shape)}"
        )
    if key.dim() != 3 or tuple(value.shape) != tuple(key.shape):
        raise ReshapeAndCacheError(
            f"{name}: key/value must be [T, KV_N, D] of equal shape, got "
            f"{tuple(key.shape)} / {tuple(value.shape)}"
        )
    if key.shape[0] != slot_indices.shape[0]:
        raise ReshapeAndCacheError(
            f"{name}: {key.shape[0]} tokens but {slot_indices.shape[0]} slot indices"
        )
    for cname, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        if cache.dim() != 4 or tuple(cache.shape[2:]) != tuple(key.shape[1:]):
            raise ReshapeAndCacheError(
                f"{name}: {cname} must be [num_blocks, block_size, {key.shape[1]}, "
                f"{key.shape[2]}], got {tuple(cache.shape)}"
            )
        if cache.dtype != key.dtype or cache.dtype not in _DTYPES:
            raise ReshapeAndCacheError(
                f"{name}: {cname} dtype {cache.dtype} must equal key dtype {key.dtype} "
                "(fp16/bf16/int8; fp32 in emulation)"
            )


def reshape_and_cache_reference(*, key, value, key_cache, value_cache, slot_indices):
    _check(key, value, key_cache, value_cache, slot_indices)
    bs = key_cache.shape[1]
    valid = slot_indices >= 0
    slots = slot_indices[valid].long()
    blk, off = slots // bs, slots % bs
    key_cache[blk, off] = key[valid]
    value_cache[blk, off] = value[valid]


def reshape_and_cache_meta(*, key, value, key_cache, value_cache, slot_indices):
    _check(key, value, key_cache, value_cache, slot_indices)


def reshape_and_cache_npu(*, key, value, key_cache, value_cache, slot_indices):
    torch_npu_module()._npu_reshape_and_cache(
        key=key, value=value, key_cache=key_cache, value_cache=value_cache,
        slot_indices=slot_indices,
    )


def npu_reshape_and_cache(
    *, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
    value_cache: torch.Tensor, slot_indices: torch.Tensor,
) -> None:
    """Same keywords and semantics as ``torch_npu._npu_reshape_and_cache``."""
    impl = pick(key.device, npu=reshape_and_cache_npu,
                reference=reshape_and_cache_reference, meta=reshape_and_cache_meta)
    impl(key=key, value=value, key_cache=key_cache, value_cache=value_cache,
         slot_indices=slot_indices)
