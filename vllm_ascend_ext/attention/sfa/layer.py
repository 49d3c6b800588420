"""The SFA attention layer object vLLM sees (KV-cache specs, backend, forward entry).

``SfaLayer`` is an ``AttentionLayerBase`` registered in the forward context under its
prefix, like vLLM's own attention layers: the runner asks it for its cache spec and
backend, binds its cache and builds its metadata. It is complete at construction:
its projections (references to the model's layers, ``SfaProjections``), its route,
its forward implementation and its two companion cache layers (rope key, indexer
key: ``caches.py``); after loading it derives its own weights
(``process_weights_after_loading``, which vLLM's loader calls on every attention
layer once the linear layers' quantization methods have processed theirs).

The model calls ``torch.ops.ascend_ext.sfa_forward`` (an opaque custom op, so a
compiled graph never freezes per-step values), which finds the layer and its
metadata in the forward context and runs the layer's forward, with the KV-transfer
hooks of its three caches.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from vllm.config import get_current_vllm_config
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
from vllm.v1.kv_cache_interface import MLAAttentionSpec

from vllm_ascend_ext.attention.sfa.caches import (
    INDEXER_CACHE,
    ROPE_CACHE,
    SfaCacheDims,
    SfaCacheLayer,
    SfaCaches,
    mla_spec,
    paged,
    register_layer,
)
from vllm_ascend_ext.attention.sfa.projections import SfaProjections
from vllm_ascend_ext.attention.sfa.route import Route
from vllm_ascend_ext.attention.sfa.transfer import run_with_kv_transfer
from vllm_ascend_ext.attention.sfa.weights import SfaWeights, prepare
from vllm_ascend_ext.ops import counting

OP_NAMESPACE = "ascend_ext"


def run_sfa_forward(hidden_states: torch.Tensor, output: torch.Tensor, layer_name: str) -> None:
    """The body of ``torch.ops.ascend_ext.sfa_forward``."""
    from vllm.model_executor.layers.attention.attention import get_attention_context
    from vllm.utils.torch_utils import _resolve_layer_name

    layer_name = _resolve_layer_name(layer_name)
    meta, layer, _, _ = get_attention_context(layer_name)
    run_with_kv_transfer(layer.cache_layer_names,
                         lambda: layer.run(hidden_states, output, meta))


def _sfa_forward_fake(hidden_states: torch.Tensor, output: torch.Tensor, layer_name: str) -> None:
    return None


@functools.cache
def sfa_forward_library() -> torch.library.Library:
    """Registers ``torch.ops.ascend_ext.sfa_forward`` (the plugin's own namespace) on
    first use and keeps its library alive; declares it a layer entry op (the op counter
    and the emulated graph capture run its body: ``ops/counting.layer_entry``)."""
    from vllm.utils.torch_utils import direct_register_custom_op

    lib = torch.library.Library(OP_NAMESPACE, "FRAGMENT")
    direct_register_custom_op("sfa_forward", run_sfa_forward, mutates_args=["output"],
                              fake_impl=_sfa_forward_fake, target_lib=lib)
    counting.layer_entry(f"{OP_NAMESPACE}.sfa_forward", run_sfa_forward,
                         counting.ATTENTION_REGION)
    return lib


class SfaLayer(nn.Module, AttentionLayerBase):
    def __init__(self, *, projections: SfaProjections, dims: SfaCacheDims, route: Route,
                 impl_kwargs: dict, rope_cos_sin: torch.Tensor, prefix: str) -> None:
        super().__init__()
        from vllm.v1.attention.selector import get_attn_backend

        cache_config = get_current_vllm_config().cache_config
        self.__dict__["projections"] = projections   # references, not submodules
        self.__dict__["rope_cos_sin"] = rope_cos_sin
        self.layer_name = prefix
        self.dims = dims
        self.route = route
        self.kv_cache_dtype = cache_config.cache_dtype if cache_config is not None else "auto"
        self.attn_backend = get_attn_backend(
            head_size=dims.latent, dtype=torch.get_default_dtype(),
            kv_cache_dtype=self.kv_cache_dtype, use_mla=True, use_sparse=True)
        self.impl = self.attn_backend.get_impl_cls()(**impl_kwargs)
        self.weights: SfaWeights | None = None        # derived from the projections after loading
        self.kv_cache = torch.tensor([])
        register_layer(self, prefix)
        # Submodule names equal the cache layers' name suffixes (module path == layer name).
        cache_backend = self.attn_backend.get_cache_backend_cls()
        setattr(self, ROPE_CACHE, SfaCacheLayer(
            width=dims.rope, kv_cache_dtype=self.kv_cache_dtype, prefix=f"{prefix}.{ROPE_CACHE}",
            backend=cache_backend))
        setattr(self, INDEXER_CACHE, SfaCacheLayer(
            width=dims.index_key, kv_cache_dtype=self.kv_cache_dtype,
            prefix=f"{prefix}.{INDEXER_CACHE}", backend=cache_backend))
        self.cache_layer_names = (prefix, f"{prefix}.{ROPE_CACHE}", f"{prefix}.{INDEXER_CACHE}")
        sfa_forward_library()

    # -- vLLM's layer interface -------------------------------------------------------
    def get_attn_backend(self):
        return self.attn_backend

    def get_kv_cache_spec(self, vllm_config) -> MLAAttentionSpec:
        return mla_spec(vllm_config, self.dims.latent, self.kv_cache_dtype)

    def bind_kv_cache(self, kv_cache: torch.Tensor) -> None:
        paged(kv_cache, self.dims.latent)        # refuse a layout the kernels cannot take
        self.kv_cache = kv_cache

    # -- the layer's own -----------------------------------------------------------
    def process_weights_after_loading(self, act_dtype: torch.dtype | None = None) -> SfaWeights:
        impl = self.impl
        self.weights = prepare(self.projections, heads=impl.num_heads, nope_dim=impl.d_nope,
                               v_dim=impl.d_v, route=self.route.preprocess,
                               dispose_fallback=self.route.dispose_fallback,
                               act_dtype=act_dtype)
        return self.weights

    def caches(self) -> SfaCaches:
        """The kernels' views of the three bound caches (views, made per call)."""
        return SfaCaches(paged(self.kv_cache, self.dims.latent),
                         getattr(self, ROPE_CACHE).paged(), getattr(self, INDEXER_CACHE).paged())

    def run(self, hidden_states: torch.Tensor, output: torch.Tensor, meta) -> None:
        if meta is None:          # profiling / dummy run without metadata
            output.zero_()
            return
        self.impl.forward(self.projections, self.weights, hidden_states, output, self.caches(),
                          meta)

    def forward(self, hidden_states: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        getattr(torch.ops, OP_NAMESPACE).sfa_forward(hidden_states, output, self.layer_name)
        return output
