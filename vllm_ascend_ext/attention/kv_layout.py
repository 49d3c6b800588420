"""How the plugin's backends lay K and V inside vLLM's per-layer KV cache.

vLLM 0.32 hands each layer a logical ``[num_blocks, KV_N, block_size, 2 * D]``
cache whose block interior is contiguous (layout ``LBHNC``). The NPU operators
(``_npu_reshape_and_cache`` and FIA with a block table) want a key cache and a
value cache each ``[num_blocks, block_size, KV_N, D]`` (FIA's ``BnBsH`` once the
last two dims are merged). The plugin reinterprets each block's bytes as
``[2, block_size, KV_N, D]``: K plane first, then V plane. Every block keeps its
own bytes (hybrid-model page sharing and block-wise KV transfer stay valid); the
K and V views are strided across blocks, contiguous within a block.
"""

from __future__ import annotations

import torch


class KVCacheLayoutError(ValueError):
    pass


def split_kv_cache(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(key_cache, value_cache), each a ``[nb, bs, KV_N, D]`` view of ``kv_cache``."""
    if kv_cache.dim() != 4 or kv_cache.shape[-1] % 2:
        raise KVCacheLayoutError(
            f"expected a [num_blocks, KV_N, block_size, 2*D] cache, got {tuple(kv_cache.shape)}"
        )
    nb, kvh, bs, two_d = kv_cache.shape
    inner = kv_cache[0] if nb else kv_cache.new_empty(kvh, bs, two_d)
    if nb and not inner.is_contiguous():
        raise KVCacheLayoutError(
            "the KV-cache block interior must be contiguous (layout LBHNC); got strides "
            f"{kv_cache.stride()}"
        )
    planes = kv_cache.as_strided(
        (nb, 2, bs, kvh, two_d // 2),
        (kv_cache.stride(0), bs * kvh * (two_d // 2), kvh * (two_d // 2), two_d // 2, 1),
        kv_cache.storage_offset(),
    )
    return planes[:, 0], planes[:, 1]
