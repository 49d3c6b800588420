"""An SFA layer's three paged caches: latent ``c^KV``, rope key ``k_r``, indexer key.

The NPU kernels take each as its own contiguous ``[num_blocks, block_size, 1, D]``
tensor addressed by block id: ``npu_sparse_flash_attention`` reads ``key`` (latent)
and ``key_rope`` through one ``block_table``, ``npu_mla_prolog_v3`` and
``npu_kv_rmsnorm_rope_cache`` write latent and rope through one slot index, and
``npu_lightning_indexer`` reads the indexer key; all of them "不支持非连续" (take no
strided tensor). One row holding all three vectors cannot give that (each would be a
strided view), and no single per-block page can hold two block-id-indexed contiguous
caches of different widths.

So each SFA layer declares three cache layers to vLLM, as vLLM's own DeepSeek-V3.2
declares its indexer cache: the ``SfaLayer`` itself (latent) and two ``SfaCacheLayer``
(``<prefix>.k_rope_cache``, ``<prefix>.indexer_k_cache``). All three are
``MLAAttentionSpec`` with the same block size, so vLLM puts them in one KV-cache group
(``UniformTypeKVCacheSpecs``): one block table and one slot mapping serve all three,
each gets its own allocation of whole per-block pages, and KV connectors (P/D
disaggregation) see three ordinary layers they can move block by block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn
from vllm.config import get_current_vllm_config
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
from vllm.v1.kv_cache_interface import MLAAttentionSpec

ROPE_CACHE = "k_rope_cache"
INDEXER_CACHE = "indexer_k_cache"


class SfaCacheLayoutError(ValueError):
    pass


@dataclass(frozen=True)
class SfaCacheDims:
    latent: int      # kv_lora_rank (Hckv)
    rope: int        # qk_rope_head_dim (Dr)
    index_key: int   # index_head_dim (Di)


class SfaCaches(NamedTuple):
    """The kernels' views: each ``[num_blocks, block_size, 1, D]``, contiguous."""

    latent: torch.Tensor
    rope: torch.Tensor
    index_key: torch.Tensor


def paged(kv_cache: torch.Tensor, width: int) -> torch.Tensor:
    """vLLM's bound cache (``[num_blocks, 1, block_size, D]``, or 3-D) as the kernels'
    contiguous ``[num_blocks, block_size, 1, D]`` (a view: same memory)."""
    if kv_cache.dim() == 4 and kv_cache.shape[1] == 1:
        kv_cache = kv_cache.squeeze(1)
    if kv_cache.dim() != 3 or kv_cache.shape[-1] != width:
        raise SfaCacheLayoutError(
            f"an SFA cache must be [num_blocks, block_size, {width}], got {tuple(kv_cache.shape)}")
    if not kv_cache.is_contiguous():
        raise SfaCacheLayoutError(
            f"an SFA cache must be contiguous (the NPU kernels take no strided cache); got "
            f"strides {kv_cache.stride()} for shape {tuple(kv_cache.shape)}")
    return kv_cache.unsqueeze(2)


def mla_spec(vllm_config, head_size: int, kv_cache_dtype: str) -> MLAAttentionSpec:
    from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype

    return MLAAttentionSpec(
        block_size=vllm_config.cache_config.block_size,
        num_kv_heads=1,
        max_tp_shards=1,
        head_size=head_size,
        dtype=kv_cache_dtype_str_to_dtype(kv_cache_dtype, vllm_config.model_config),
        cache_dtype_str=kv_cache_dtype,
    )


def register_layer(layer: nn.Module, prefix: str) -> None:
    ctx = get_current_vllm_config().compilation_config.static_forward_context
    if prefix in ctx:
        raise ValueError(f"Duplicate layer name: {prefix}")
    ctx[prefix] = layer


class SfaCacheLayer(nn.Module, AttentionLayerBase):
    """A cache the SFA layer's forward writes and reads (rope key or indexer key).

    ``backend``: the companion caches' attention backend, which the SFA layer passes in
    (its own backend's ``get_cache_backend_cls()``): this module never imports a backend.
    """

    def __init__(self, *, width: int, kv_cache_dtype: str, prefix: str, backend: type) -> None:
        super().__init__()
        self.layer_name = prefix
        self.width = width
        self.kv_cache_dtype = kv_cache_dtype
        self.cache_backend = backend  # not "attn_backend": that marks layers running attention
        self.kv_cache = torch.tensor([])
        register_layer(self, prefix)

    def bind_kv_cache(self, kv_cache: torch.Tensor) -> None:
        paged(kv_cache, self.width)              # refuse a layout the kernels cannot take
        self.kv_cache = kv_cache

    def paged(self) -> torch.Tensor:
        """The kernels' view of the bound cache (a view, made per call: nothing but
        ``kv_cache`` holds the cache memory, so vLLM can release it)."""
        return paged(self.kv_cache, self.width)

    def get_attn_backend(self):
        return self.cache_backend

    def get_kv_cache_spec(self, vllm_config) -> MLAAttentionSpec:
        return mla_spec(vllm_config, self.width, self.kv_cache_dtype)
