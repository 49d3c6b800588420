"""Paged KV-cache write: ``torch_npu.npu_scatter_pa_kv_cache`` in ND (``cache_mode="Norm"``).

The writer torch-npu 2.13 documents for paged K/V caches (its scenario 2; vllm-ascend's
``BaseDeviceAdaptor.reshape_and_cache`` writes with it, ATB's ``_npu_reshape_and_cache``
only on 310P):

    torch_npu.npu_scatter_pa_kv_cache(key, value, key_cache, value_cache, slot_mapping,
                                      cache_mode="Norm")

Semantics (torch_npu docs, "场景二"):
- ``key``/``value``: [T, KV_N, D] (fp16/bf16/int8; the emulation also takes fp32);
- ``key_cache``/``value_cache``: [num_blocks, block_size, KV_N, D], ND format
  ("当传None或'Norm'时，仅支持ND内存排布格式"; the default ``"PA_NZ"`` needs NZ caches),
  written in place ("本质in-place更新"): token ``t`` goes to block ``slot // block_size``,
  row ``slot % block_size``;
- ``slot_mapping``: int32 or int64 [T], every value in ``[0, num_blocks * block_size - 1]``
  ("slot_mapping的值范围[0,num_blocks*block_size-1]"): **no negative padding slots**
  (the FIA builder points negative slots at vLLM's never-read null block), no duplicates;
- no strided inputs ("输入参数不支持非连续"); all four tensors of one dtype.
Returns None.
"""

from __future__ import annotations

import torch

from vllm_ascend_ext.ops._dispatch import torch_npu_module
from vllm_ascend_ext.ops.compiled import emulation_kernel
from vllm_ascend_ext.ops.counting import npu_op
from vllm_ascend_ext.ops.op_record import NpuOp

OP = "npu_scatter_pa_kv_cache"
KERNEL = "emu_scatter_pa_kv_cache"
_DTYPES = (torch.float16, torch.bfloat16, torch.int8, torch.float32)


class ScatterKvCacheError(ValueError):
    pass


def _check(key, value, key_cache, value_cache, slot_mapping, cache_mode) -> None:
    if cache_mode not in (None, "Norm"):
        raise NotImplementedError(f"{OP}: cache_mode {cache_mode!r} (NZ caches) is not emulated")
    if slot_mapping.dtype not in (torch.int32, torch.int64) or slot_mapping.dim() != 1:
        raise ScatterKvCacheError(
            f"{OP}: slot_mapping must be int32 or int64 [T], got {slot_mapping.dtype} "
            f"{tuple(slot_mapping.shape)}")
    if key.dim() != 3 or tuple(value.shape[:2]) != tuple(key.shape[:2]):
        raise ScatterKvCacheError(
            f"{OP}: key/value must be [T, KV_N, D] with equal first two dims, got "
            f"{tuple(key.shape)} / {tuple(value.shape)}")
    if value.dtype != key.dtype:
        raise ScatterKvCacheError(f"{OP}: value dtype {value.dtype} must equal key dtype {key.dtype}")
    if key.shape[0] != slot_mapping.shape[0]:
        raise ScatterKvCacheError(
            f"{OP}: {key.shape[0]} tokens but {slot_mapping.shape[0]} slots")
    for cname, cache, src in (("key_cache", key_cache, key), ("value_cache", value_cache, value)):
        if cache.dim() != 4 or tuple(cache.shape[2:]) != tuple(src.shape[1:]):
            raise ScatterKvCacheError(
                f"{OP}: {cname} must be [num_blocks, block_size, {src.shape[1]}, "
                f"{src.shape[2]}], got {tuple(cache.shape)}")
        if cache.dtype != key.dtype or cache.dtype not in _DTYPES:
            raise ScatterKvCacheError(
                f"{OP}: {cname} dtype {cache.dtype} must equal key dtype {key.dtype} "
                "(fp16/bf16/int8; fp32 in emulation)")


def scatter_pa_kv_cache_reference(key, value, key_cache, value_cache, slot_mapping, *,
                                  compress_lens=None, compress_seq_offsets=None, seq_lens=None,
                                  cache_mode="PA_NZ"):
    _check(key, value, key_cache, value_cache, slot_mapping, cache_mode)
    rows = key_cache.shape[0] * key_cache.shape[1]
    if slot_mapping.numel():
        lo, hi = (int(x) for x in torch.aminmax(slot_mapping))
        if lo < 0 or hi >= rows:
            raise ScatterKvCacheError(
                f"{OP}: slots must lie in [0, {rows - 1}] (no padding slots), got [{lo}, {hi}]")
    slots = slot_mapping.long()
    for src, cache in ((key, key_cache), (value, value_cache)):
        if cache.is_contiguous() and src.dtype == cache.dtype:  # one row copy per token
            cache.view(rows, -1).index_copy_(0, slots, src.reshape(src.shape[0], -1))
        else:
            bs = cache.shape[1]
            cache[slots // bs, slots % bs] = src


def _rows_contiguous(t: torch.Tensor) -> bool:
    return t.stride(-1) == 1 and t.stride(-2) == t.shape[-1]


def scatter_pa_kv_cache_emulated(key, value, key_cache, value_cache, slot_mapping, *,
                                 cache_mode="PA_NZ"):
    """The emulation's cache write: the compiled kernel (``csrc/emu_kv_cache.cpp``: checks
    every slot, then one row copy per token, blocks read through their strides, as the
    backend's plane views are) after the reference's checks, or the reference itself."""
    _check(key, value, key_cache, value_cache, slot_mapping, cache_mode)
    kernel = emulation_kernel(KERNEL, key.device)
    if kernel is None or not all(_rows_contiguous(t) for t in (key, value, key_cache, value_cache)) \
            or any(t.stride(1) != t.shape[2] * t.shape[3] for t in (key_cache, value_cache)):
        return scatter_pa_kv_cache_reference(key, value, key_cache, value_cache, slot_mapping,
                                             cache_mode=cache_mode)
    try:
        kernel(key, value, key_cache, value_cache, slot_mapping)
    except RuntimeError as exc:  # the kernel's own check: a slot outside the cache
        if "slots must lie in" not in str(exc):
            raise
        raise ScatterKvCacheError(f"{OP}: {exc}".split("\n")[0]) from None


def scatter_pa_kv_cache_meta(key, value, key_cache, value_cache, slot_mapping, *,
                             cache_mode="PA_NZ", **_):
    _check(key, value, key_cache, value_cache, slot_mapping, cache_mode)


def scatter_pa_kv_cache_npu(key, value, key_cache, value_cache, slot_mapping, *, cache_mode):
    torch_npu_module().npu_scatter_pa_kv_cache(key, value, key_cache, value_cache, slot_mapping,
                                               cache_mode=cache_mode)


@npu_op(OP)
def npu_scatter_pa_kv_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                            value_cache: torch.Tensor, slot_mapping: torch.Tensor, *,
                            cache_mode: str = "Norm") -> None:
    """torch_npu's positional tensors; ``cache_mode`` defaults to the ND mode the plugin's
    caches need (torch_npu's own default is ``"PA_NZ"``)."""
    impl = SCATTER_PA_KV_CACHE.pick(key.device)
    impl(key, value, key_cache, value_cache, slot_mapping, cache_mode=cache_mode)


SCATTER_PA_KV_CACHE = NpuOp(OP, npu=scatter_pa_kv_cache_npu, reference=scatter_pa_kv_cache_reference,
                            meta=scatter_pa_kv_cache_meta,
                            emulation=scatter_pa_kv_cache_emulated, kernel=KERNEL,
                            rules="SCATTER_RULES")
