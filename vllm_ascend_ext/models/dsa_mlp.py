"""DeepSeek-V3.2's MLP blocks in the plugin's model: the dense MLP and the MoE block with
its shared expert, built so a W8A8 MLP's activation is one launch on A2/A3
(``layers/w8a8_mlp.py``).

``DsaMLP`` is vLLM's ``DeepseekV2MLP`` (same weights, same names, same tensor-parallel
layout) with a forward that takes the fused W8A8 route where it was decided at build
time, and vLLM's forward otherwise. ``DsaMoE`` is the MoE block vLLM's
``DeepseekV2MoE`` builds (the router gate, the shared expert, vLLM's fused-MoE layer with
the plugin's MoE method underneath) with a ``DsaMLP`` as its shared expert: vLLM's block
builds its shared expert inside its constructor, so the plugin's model builds the
block itself. vLLM's fused-MoE layer runs the shared expert and combines it with the
routed experts, as for vLLM's block. Unlike vLLM's block, it also runs sequence-parallel
under TP + EP without DP when ``ascend_ext.moe_dispatch`` asks for a token exchange
(``moe/token_split.py``).
"""

from __future__ import annotations

import torch
from torch import nn
from vllm.distributed import tensor_model_parallel_all_gather
from vllm.model_executor.layers.fused_moe import FusedMoEFactory, GateLinear
from vllm.model_executor.models.deepseek_v2 import DeepseekV2MLP, _get_moe_router_dtype
from vllm.model_executor.models.utils import sequence_parallel_chunk

from vllm_ascend_ext.layers.switch import contract_in_trace
from vllm_ascend_ext.layers.w8a8_mlp import takes_fused_w8a8_mlp, w8a8_mlp, w8a8_mlp_prequantized
from vllm_ascend_ext.moe.token_split import sequence_parallel_moe
from vllm_ascend_ext.platform.soc import current_family
from vllm_ascend_ext.quantization.w8a8_dynamic import apply_prequantized


class DsaMLP(DeepseekV2MLP):
    def __init__(self, *, layer_ops: str, **kwargs) -> None:
        super().__init__(**kwargs)
        # W8A8 on A2/A3 with the layer ops on: one npu_dequant_swiglu_quant for the
        # activation (decided once; the linear methods are chosen by now)
        self.fused_activation = takes_fused_w8a8_mlp(self, layer_ops, current_family())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused_activation and not contract_in_trace():
            return w8a8_mlp(self, x)
        return super().forward(x)

    def forward_prequantized(self, xq: torch.Tensor, sx: torch.Tensor,
                             out_dtype: torch.dtype) -> torch.Tensor:
        """The output for an input already quantized per token (int8 ``xq``, fp32 ``sx``),
        by the post-attention norm's fused quantization (``layers/norm_quant.py``)."""
        if self.fused_activation:
            return w8a8_mlp_prequantized(self, xq, sx, out_dtype)
        gate_up = apply_prequantized(self.gate_up_proj, xq, sx, out_dtype)
        out, _ = self.down_proj(self.act_fn(gate_up))
        return out


class DsaMoE(nn.Module):
    """vLLM's DeepSeek MoE block (router gate, shared expert, routed experts) with the
    plugin's shared expert (module docstring)."""

    def __init__(self, *, config, parallel_config, quant_config, prefix: str,
                 layer_ops: str, moe_dispatch: str = "auto") -> None:
        super().__init__()
        if config.hidden_act != "silu":
            raise ValueError(f"{prefix}: hidden_act {config.hidden_act!r}; DeepSeek MoE "
                             "layers take 'silu'")
        # vLLM's rule (DP x TP with EP), and TP + EP without DP when a token exchange is
        # asked for (moe/token_split.py)
        self.is_sequence_parallel = sequence_parallel_moe(parallel_config, moe_dispatch)
        self.gate = GateLinear(config.hidden_size, config.n_routed_experts,
                               out_dtype=_get_moe_router_dtype(config),
                               prefix=f"{prefix}.gate")
        if getattr(config, "topk_method", None) == "noaux_tc":
            self.gate.e_score_correction_bias = nn.Parameter(
                torch.empty(config.n_routed_experts, dtype=torch.float32))
        else:
            self.gate.e_score_correction_bias = None
        self.shared_experts = None if not config.n_shared_experts else DsaMLP(
            layer_ops=layer_ops, hidden_size=config.hidden_size,
            intermediate_size=config.moe_intermediate_size * config.n_shared_experts,
            hidden_act=config.hidden_act, quant_config=quant_config,
            is_sequence_parallel=self.is_sequence_parallel, reduce_results=False,
            prefix=f"{prefix}.shared_experts")
        eplb = parallel_config.eplb_config
        self.experts = FusedMoEFactory(
            shared_experts=self.shared_experts, gate=self.gate,
            num_experts=config.n_routed_experts, top_k=config.num_experts_per_tok,
            hidden_size=config.hidden_size, intermediate_size=config.moe_intermediate_size,
            renormalize=config.norm_topk_prob, quant_config=quant_config,
            use_grouped_topk=True, num_expert_group=getattr(config, "n_group", 1),
            topk_group=getattr(config, "topk_group", 1), prefix=f"{prefix}.experts",
            scoring_func=getattr(config, "scoring_func", "softmax"),
            routed_scaling_factor=getattr(config, "routed_scaling_factor", 1.0),
            apply_routed_scale_to_output=True,
            e_score_correction_bias=self.gate.e_score_correction_bias,
            enable_eplb=parallel_config.enable_eplb,
            num_redundant_experts=eplb.num_redundant_experts,
            is_sequence_parallel=self.is_sequence_parallel, reduce_results=True,
            n_shared_experts=None, fuse_shared_experts=False,
            shared_expert_prefix=f"{prefix}.shared_experts",
            router_logits_dtype=self.gate.out_dtype)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        num_tokens, hidden = hidden_states.shape
        hidden_states = hidden_states.view(-1, hidden)
        if self.is_sequence_parallel:
            hidden_states = sequence_parallel_chunk(hidden_states)
        out = self.experts(hidden_states=hidden_states, router_logits=hidden_states)
        if self.is_sequence_parallel:
            out = tensor_model_parallel_all_gather(out, 0)[:num_tokens]
        return out.view(num_tokens, hidden)
