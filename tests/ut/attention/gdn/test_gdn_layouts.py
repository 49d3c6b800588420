"""Both checkpoint layouts through the plugin's GDN layer code, against Hugging Face.

Qwen3-Next stores ``in_proj_qkvz`` / ``in_proj_ba`` interleaved per key-head group
(vLLM builds the layer with ``gqa_interleaved_layout=True``); Qwen3.5 stores
``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a`` apart, which vLLM loads into
flat merged projections (``False``). vLLM 0.32's Qwen3.5 model class does not import on
this CPU build (torchvision), so the layer is checked here at the layer level: the
plugin's ``project`` (vLLM's splitting for each layout) + ``gdn_core`` (one prefill span,
fp64, both op tables) + the model's own gated norm and output projection == Hugging Face
transformers' own ``Qwen3NextGatedDeltaNet`` / ``Qwen3_5GatedDeltaNet`` forward on the
same weights (its PyTorch GDN code, which computes the recurrence in float32: hence a
float32-level tolerance). Reading a checkpoint with the other layout's split is the
negative control.
"""

from __future__ import annotations

import types

import pytest
import torch
from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import (
    QwenGatedDeltaNetAttention,
)

from vllm_ascend_ext.attention.gdn.core import GdnDims, GdnWeights, gdn_core
from vllm_ascend_ext.attention.gdn.layer import AscendGatedDeltaNet
from vllm_ascend_ext.attention.gdn.ops_table import gdn_ops_for
from vllm_ascend_ext.attention.gdn.spans import plan_spans

NK, NV, DK, DV, H, K = 2, 4, 16, 8, 32, 4
COMMON = dict(hidden_size=H, linear_num_key_heads=NK, linear_num_value_heads=NV,
              linear_key_head_dim=DK, linear_value_head_dim=DV, linear_conv_kernel_dim=K,
              hidden_act="silu", rms_norm_eps=1e-6, num_hidden_layers=1,
              layer_types=["linear_attention"])


def hf_layer(kind: str):
    torch.manual_seed(0)
    if kind == "qwen3_next":
        from transformers import Qwen3NextConfig
        from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

        layer = Qwen3NextGatedDeltaNet(Qwen3NextConfig(**COMMON), 0)
    else:
        from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

        layer = Qwen3_5GatedDeltaNet(Qwen3_5TextConfig(**COMMON), 0)
    layer = layer.double().eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) / max(p.shape[-1], 1) ** 0.5)
        layer.A_log.copy_(torch.rand(NV) - 1.0)
        layer.dt_bias.copy_(torch.rand(NV))
        layer.norm.weight.copy_(1 + 0.1 * torch.randn(DV))
    return layer


def projecting_self(hf, interleaved: bool):
    """The attributes ``AscendGatedDeltaNet.project`` reads, with vLLM's merged weights."""
    if hasattr(hf, "in_proj_qkvz"):  # Qwen3-Next's checkpoint
        w_qkvz, w_ba = hf.in_proj_qkvz.weight, hf.in_proj_ba.weight
    else:  # vLLM's merged shards: [q k v | z] and [b | a]
        w_qkvz = torch.cat([hf.in_proj_qkv.weight, hf.in_proj_z.weight])
        w_ba = torch.cat([hf.in_proj_b.weight, hf.in_proj_a.weight])
    ns = types.SimpleNamespace(
        gqa_interleaved_layout=interleaved, tp_size=1, num_k_heads=NK, num_v_heads=NV,
        head_k_dim=DK, head_v_dim=DV, key_dim=NK * DK, value_dim=NV * DV,
        disable_tp_for_ba_proj=False,
        in_proj_qkvz=lambda h: (h @ w_qkvz.t(), None), in_proj_ba=lambda h: (h @ w_ba.t(), None))
    for name in ("fix_query_key_value_ordering", "split_ba"):
        setattr(ns, name, types.MethodType(getattr(QwenGatedDeltaNetAttention, name), ns))
    return ns


def metadata(lens):
    from types import SimpleNamespace

    from vllm_ascend_ext.attention.gdn.builder import AscendGdnMetadataBuilder

    b = AscendGdnMetadataBuilder.__new__(AscendGdnMetadataBuilder)
    b.num_spec, b.use_spec_decode, b.kv_cache_spec = 0, False, None
    b.vllm_config = SimpleNamespace(cache_config=SimpleNamespace(mamba_cache_mode="none"))
    qsl = [0]
    for n in lens:
        qsl.append(qsl[-1] + n)
    cam = SimpleNamespace(num_actual_tokens=qsl[-1], seq_lens=torch.tensor(lens),
                          query_start_loc=torch.tensor(qsl, dtype=torch.int32),
                          block_table_tensor=torch.arange(1, len(lens) + 1,
                                                          dtype=torch.int32)[:, None])
    return b.build_from_spans(plan_spans(list(lens), [0] * len(lens), None, 0), cam, None)


def run_both(kind, interleaved, family):
    hf = hf_layer(kind)
    lens = [7, 3]
    hs = [torch.randn(1, n, H, dtype=torch.float64) for n in lens]
    with torch.no_grad():
        want = torch.cat([hf(h)[0] for h in hs])
        mixed_qkv, z, b, a = AscendGatedDeltaNet.project(projecting_self(hf, interleaved),
                                                          torch.cat([h[0] for h in hs]))
        conv_dim = 2 * NK * DK + NV * DV
        conv = torch.zeros(4, K - 1, conv_dim, dtype=torch.float64)
        ssm = torch.full((4, NV, DV, DK), float("nan"), dtype=torch.float64)  # never read
        w = hf.conv1d.weight
        weights = GdnWeights(conv_weight=w.view(w.shape[0], K).t(), conv_bias=hf.conv1d.bias,
                             a_log=hf.A_log, dt_bias=hf.dt_bias, silu=True)
        out = torch.zeros(sum(lens), NV, DV, dtype=torch.float64)
        gdn_core(metadata(lens), gdn_ops_for(family), GdnDims(NK, NV, DK, DV), weights, conv,
                 ssm, mixed_qkv, b.contiguous(), a.contiguous(), out)
        got = hf.out_proj(hf.norm(out.reshape(-1, DV), z.reshape(-1, DV)).reshape(sum(lens), -1))
    return got, want, ssm


@pytest.mark.parametrize("family", ["A2", "A5"])
@pytest.mark.parametrize("kind,interleaved", [("qwen3_next", True), ("qwen3_5", False)])
def test_layer_matches_hugging_face(kind, interleaved, family):
    got, want, ssm = run_both(kind, interleaved, family)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert not torch.isnan(ssm[1:3]).any()  # both requests' final states were written


@pytest.mark.parametrize("kind,interleaved", [("qwen3_next", False), ("qwen3_5", True)])
def test_the_other_layouts_split_changes_the_result(kind, interleaved):
    got, want, _ = run_both(kind, interleaved, "A2")
    assert (got - want).abs().max() > 1e-2
