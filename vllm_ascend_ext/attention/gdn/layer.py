"""The plugin's Gated-DeltaNet layer: vLLM's ``QwenGatedDeltaNetAttention`` with its own core.

Registered with ``PluggableLayer.register_oot`` under that class name while the plugin's
platform is active (emulated or NPU), so Qwen3-Next (``gqa_interleaved_layout=True``) and
Qwen3.5 (``False``) build it in place of vLLM's. It keeps vLLM's projections, weight
loading, state shapes and output norm; it replaces the forward (vLLM's picks Triton on an
OOT platform and a bf16-only kernel on the CPU) and selects the plugin's backend through
``get_attn_backend()``. The core runs inside ``torch.ops.ascend_ext.gdn_forward``, an
opaque custom op, so a compiled graph never freezes per-step values.
"""

from __future__ import annotations

import functools

import torch
from vllm.logger import init_logger
from vllm.model_executor.custom_op import PluggableLayer, op_registry_oot
from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import (
    QwenGatedDeltaNetAttention,
)

from vllm_ascend_ext.attention.gdn.backend import AscendGdnBackend
from vllm_ascend_ext.attention.gdn.core import GdnDims, GdnWeights, gdn_core
from vllm_ascend_ext.attention.gdn.ops_table import GdnOps, HeadShape, gdn_ops_for
from vllm_ascend_ext.errors import AscendExtError
from vllm_ascend_ext.ops import counting

logger = init_logger("vllm.ascend_ext")
OP_NAMESPACE = "ascend_ext"
LAYER_NAME = "QwenGatedDeltaNetAttention"


def _current_family() -> str:
    from vllm_ascend_ext.platform.soc import current_family

    return current_family() or "A2"


def _binding_state_dtype(state_dtype: torch.dtype) -> str | None:
    """The state dtype where the kernels' documented dtypes bind: on an NPU or in
    contract mode; None in plain emulation."""
    from vllm.platforms import current_platform

    from vllm_ascend_ext.contract import mode as contract_mode

    if current_platform.device_type == "npu" or contract_mode.enabled():
        return str(state_dtype).removeprefix("torch.")
    return None


def conv_state_view(conv: torch.Tensor) -> torch.Tensor:
    """The conv state as ``[N, state_len, dim]`` whatever vLLM's layout setting."""
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

    return conv.transpose(-1, -2) if is_conv_state_dim_first() else conv


class ConvWeightError(AscendExtError):
    """The GDN conv weight is not in the plain layout the conv op reads."""


def conv_taps(conv1d) -> torch.Tensor:
    """The conv weight as ``[K, dim]`` (a view of vLLM's ``[dim, 1, K]`` parameter), or a
    refusal when something repacked it (vLLM's CPU GEMM dispatch packs bf16 width-4 conv
    weights in place for its own kernel: read as plain taps they are garbage)."""
    w = conv1d.weight
    if hasattr(conv1d, "_cpu_unpacked_conv_weight") or w.dim() != 3 or w.shape[1] != 1:
        raise ConvWeightError(
            f"GDN conv1d weight has shape {tuple(w.shape)}: it was repacked after loading "
            "(vLLM's CPU GEMM dispatch), not the [dim, 1, K] taps the plugin's conv op reads")
    return w.view(w.shape[0], w.shape[-1]).t()


def run_gdn_forward(mixed_qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
                    core_attn_out: torch.Tensor, layer_name: str) -> None:
    """The body of ``torch.ops.ascend_ext.gdn_forward``."""
    from vllm.forward_context import get_forward_context
    from vllm.utils.torch_utils import _resolve_layer_name

    ctx = get_forward_context()
    layer = ctx.no_compile_layers[_resolve_layer_name(layer_name)]
    metadata = ctx.attn_metadata
    md = metadata.get(layer.prefix) if isinstance(metadata, dict) else None
    if md is None:  # the profiling run: no state yet
        return
    conv, ssm = layer.kv_cache[0], layer.kv_cache[1]
    gdn_core(md, layer.gdn_ops, layer.gdn_dims, layer.gdn_weights(), conv_state_view(conv),
             ssm, mixed_qkv, b, a, core_attn_out)


def _gdn_forward_fake(mixed_qkv, b, a, core_attn_out, layer_name) -> None:
    return None


@functools.cache
def gdn_forward_library() -> torch.library.Library:
    """Registers ``torch.ops.ascend_ext.gdn_forward`` on first use, a layer entry op
    (``ops/counting.layer_entry``)."""
    from vllm.utils.torch_utils import direct_register_custom_op

    lib = torch.library.Library(OP_NAMESPACE, "FRAGMENT")
    direct_register_custom_op("gdn_forward", run_gdn_forward, mutates_args=["core_attn_out"],
                              fake_impl=_gdn_forward_fake, target_lib=lib)
    counting.layer_entry(f"{OP_NAMESPACE}.gdn_forward", run_gdn_forward,
                         counting.ATTENTION_REGION)
    return lib


class AscendGatedDeltaNet(QwenGatedDeltaNetAttention):
    """vLLM's Qwen GDN layer with the plugin's backend and core."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # The conv op reads the taps as plain [dim, 1, K] values: keep vLLM's CPU weight
        # dispatch from repacking them in place (it does for bf16, width 4, on CPUs with
        # AVX-512 BF16), as vLLM's MLA keeps kv_b_proj (docs/hybrid.md).
        self.conv1d._cpu_skip_gemm_dispatch = True
        self._forward_method = self.forward_ascend
        self.gdn_dims = GdnDims(num_k_heads=self.num_k_heads // self.tp_size,
                                num_v_heads=self.num_v_heads // self.tp_size,
                                head_k_dim=self.head_k_dim, head_v_dim=self.head_v_dim)
        self.gdn_ops: GdnOps = gdn_ops_for(
            _current_family(), num_spec=self.num_spec,
            state_dtype=_binding_state_dtype(self.get_state_dtype()[1]),
            shape=HeadShape(self.gdn_dims.num_k_heads, self.gdn_dims.num_v_heads,
                            self.gdn_dims.head_k_dim, self.gdn_dims.head_v_dim))
        if self.gdn_ops.why:
            logger.info_once("ascend_ext: GDN layers: decode %s, prefill %s (%s)",
                             self.gdn_ops.decode, self.gdn_ops.prefill, self.gdn_ops.why)
        gdn_forward_library()

    def get_attn_backend(self):
        return AscendGdnBackend

    def gdn_weights(self) -> GdnWeights:
        return GdnWeights(conv_weight=conv_taps(self.conv1d),
                          conv_bias=self.conv1d.bias, a_log=self.A_log, dt_bias=self.dt_bias,
                          silu=self.activation in ("silu", "swish"))

    def project(self, hidden_states: torch.Tensor):
        """(mixed_qkv [T, 2*key_dim + value_dim], z [T, Nv, Dv], b, a [T, Nv]), both layouts."""
        mixed_qkvz, _ = self.in_proj_qkvz(hidden_states)
        ba, _ = self.in_proj_ba(hidden_states)
        if self.gqa_interleaved_layout:  # Qwen3-Next: per key-head groups [q k v z], [b a]
            q, k, v, z, b, a = self.fix_query_key_value_ordering(mixed_qkvz, ba)
            n = hidden_states.shape[0]
            mixed_qkv = torch.cat((q.reshape(n, -1), k.reshape(n, -1), v.reshape(n, -1)), -1)
            return mixed_qkv, z, b, a
        qkv_size = (self.key_dim * 2 + self.value_dim) // self.tp_size
        mixed_qkv, z = mixed_qkvz.split([qkv_size, self.value_dim // self.tp_size], dim=-1)
        b, a = self.split_ba(ba)
        return mixed_qkv, z.reshape(z.shape[0], -1, self.head_v_dim), b, a

    def forward_ascend(self, hidden_states: torch.Tensor) -> torch.Tensor:
        mixed_qkv, z, b, a = self.project(hidden_states)
        core_attn_out = torch.zeros(
            (hidden_states.shape[0], self.num_v_heads // self.tp_size, self.head_v_dim),
            dtype=hidden_states.dtype, device=hidden_states.device)
        getattr(torch.ops, OP_NAMESPACE).gdn_forward(
            mixed_qkv, b.contiguous(), a.contiguous(), core_attn_out,
            self.prefix)
        return self._output_projection(core_attn_out, z)


def register() -> None:
    """Build the plugin's GDN layer wherever a model asks for vLLM's (idempotent)."""
    if op_registry_oot.get(LAYER_NAME) is not AscendGatedDeltaNet:
        if LAYER_NAME in op_registry_oot:
            raise RuntimeError(f"another plugin registered an out-of-tree {LAYER_NAME}: "
                               f"{op_registry_oot[LAYER_NAME]}")
        PluggableLayer.register_oot(AscendGatedDeltaNet, name=LAYER_NAME)
