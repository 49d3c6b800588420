"""DeepSeek-V3.2 / GLM-5 (DSA) served through the plugin's SFA backend.

vLLM's own DeepSeek-V3.2 builds an indexer whose cache layer hard-codes vLLM's
Triton indexer backend, so the plugin registers this model class for the DSA
architectures (``ModelRegistry.register_model``, only while the plugin's platform
is active). Everything but attention reuses vLLM's layers (embeddings, RMSNorm,
linear layers with their quantization methods, the fused-MoE layer); the MLP and the
MoE block are vLLM's DeepSeek ones built by the plugin (``models/dsa_mlp.py``, so a
W8A8 MLP's activation can be one launch); each
attention layer owns its projection weights and an ``SfaLayer`` that vLLM's runner
treats like any attention layer (cache spec, metadata builder, forward context).

The preprocessing route of every layer (native chain or ``npu_mla_prolog_v3``) is
decided at construction by ``attention.sfa.route.decide`` and logged once per model;
a forced route the layer cannot take fails here, before weights load.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.distributed import get_pp_group, get_tensor_model_parallel_world_size
from vllm.logger import init_logger
from vllm.model_executor.layers.fused_moe import fused_moe_make_expert_params_mapping
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.deepseek_v2 import yarn_get_mscale
from vllm.model_executor.models.utils import make_layers, maybe_prefix

from vllm_ascend_ext.attention.sfa import route as sfa_route
from vllm_ascend_ext.attention.sfa.caches import SfaCacheDims
from vllm_ascend_ext.attention.sfa.indexer import IndexerSpec
from vllm_ascend_ext.attention.sfa.layer import SfaLayer
from vllm_ascend_ext.attention.sfa.projections import SfaProjections
from vllm_ascend_ext.attention.sfa.weights import PROLOG_SOURCES
from vllm_ascend_ext.config import get_config
from vllm_ascend_ext.layers.norm_quant import mlp_after_norm, takes_fused_norm_quant
from vllm_ascend_ext.models.dsa_mlp import DsaMLP, DsaMoE
from vllm_ascend_ext.platform.soc import current_family
from vllm_ascend_ext.quantization.w8a8_dynamic import is_w8a8

logger = init_logger("vllm.ascend_ext")


def layer_facts(vllm_config: VllmConfig, attn: nn.Module) -> sfa_route.LayerFacts:
    """The plain values the route decision needs, read from the config and the layer."""
    kinds = {"w8a8_dynamic" if is_w8a8(getattr(attn, n)) else "float"
             for n in PROLOG_SOURCES}
    quant = kinds.pop() if len(kinds) == 1 else "mixed"
    ktc = vllm_config.kv_transfer_config
    role = (ktc.kv_role if ktc is not None and ktc.kv_role else "none")
    cache_dtype = str(vllm_config.cache_config.cache_dtype)
    soc = current_family() or "A3"
    return sfa_route.LayerFacts(
        quant=quant, kv_role=role,
        prefill_cp=vllm_config.parallel_config.prefill_context_parallel_size > 1,
        kv_cache_quant="c8" if cache_dtype.startswith(("int8", "fp8")) else "none",
        soc_family=soc, rope_dim=attn.qk_rope_head_dim)


class DsaIndexerWeights(nn.Module):
    """The indexer's weights (names as in DeepSeek-V3.2 checkpoints)."""

    def __init__(self, config, quant_config, prefix: str) -> None:
        super().__init__()
        self.n_heads, self.head_dim = config.index_n_heads, config.index_head_dim
        self.wq_b = ReplicatedLinear(config.q_lora_rank, self.n_heads * self.head_dim, bias=False,
                                     quant_config=quant_config, prefix=f"{prefix}.wq_b")
        # Fused wk + weights_proj: one GEMM producing [head_dim + n_heads]; never quantized.
        self.wk_weights_proj = MergedColumnParallelLinear(
            config.hidden_size, [self.head_dim, self.n_heads], bias=False, quant_config=None,
            disable_tp=True, prefix=f"{prefix}.wk_weights_proj")
        self.k_norm = nn.LayerNorm(self.head_dim, eps=1e-6)


class DsaAttention(nn.Module):
    def __init__(self, vllm_config: VllmConfig, config, prefix: str) -> None:
        super().__init__()
        qc = vllm_config.quant_config
        tp = get_tensor_model_parallel_world_size()
        self.num_heads = config.num_attention_heads
        self.num_local_heads = self.num_heads // tp
        self.qk_nope_head_dim = config.qk_nope_head_dim
        self.qk_rope_head_dim = config.qk_rope_head_dim
        self.v_head_dim = config.v_head_dim
        self.kv_lora_rank = config.kv_lora_rank
        qk_head = self.qk_nope_head_dim + self.qk_rope_head_dim
        hidden = config.hidden_size
        self.q_a_proj = ReplicatedLinear(hidden, config.q_lora_rank, bias=False, quant_config=qc,
                                         prefix=f"{prefix}.q_a_proj")
        self.q_a_layernorm = RMSNorm(config.q_lora_rank, eps=config.rms_norm_eps)
        self.q_b_proj = ColumnParallelLinear(config.q_lora_rank, self.num_heads * qk_head,
                                             bias=False, quant_config=qc, prefix=f"{prefix}.q_b_proj")
        self.kv_a_proj_with_mqa = ReplicatedLinear(
            hidden, self.kv_lora_rank + self.qk_rope_head_dim, bias=False, quant_config=qc,
            prefix=f"{prefix}.kv_a_proj_with_mqa")
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, eps=config.rms_norm_eps)
        self.kv_b_proj = ColumnParallelLinear(
            self.kv_lora_rank, self.num_heads * (self.qk_nope_head_dim + self.v_head_dim),
            bias=False, quant_config=qc, prefix=f"{prefix}.kv_b_proj")
        self.o_proj = RowParallelLinear(self.num_heads * self.v_head_dim, hidden, bias=False,
                                        quant_config=qc, prefix=f"{prefix}.o_proj")
        self.indexer = DsaIndexerWeights(config, qc, f"{prefix}.indexer")
        # vLLM's CPU linear method repacks weights and drops the originals; the SFA path
        # reads these weights itself (absorption, prolog layout, indexer fallback).
        for lin in (self.q_a_proj, self.q_b_proj, self.kv_a_proj_with_mqa, self.kv_b_proj,
                    self.indexer.wq_b, self.indexer.wk_weights_proj):
            lin._cpu_skip_gemm_dispatch = True
        rope_parameters = dict(config.rope_parameters)
        scale = qk_head ** -0.5
        if rope_parameters.get("rope_type", "default") != "default":
            rope_parameters["rope_type"] = (
                "deepseek_llama_scaling" if rope_parameters.get("attention_factor") == 1.0
                else "deepseek_yarn")
            if rope_parameters["rope_type"] == "deepseek_yarn":
                m = yarn_get_mscale(rope_parameters["factor"],
                                    float(rope_parameters.get("mscale_all_dim", False)))
                scale = scale * m * m
        self.rotary_emb = get_rope(self.qk_rope_head_dim,
                                   max_position=getattr(config, "max_position_embeddings", 8192),
                                   rope_parameters=rope_parameters, is_neox_style=False)

        route = sfa_route.decide(layer_facts(vllm_config, self),
                                 get_config(vllm_config).sfa.preprocess)
        if route.prolog_op not in (None, sfa_route.PROLOG_V3):
            raise NotImplementedError(
                f"{prefix}: SFA layers need RoPE dims; prolog {route.prolog_op} "
                "is for no-RoPE MLA layers")
        self.attn = SfaLayer(
            projections=SfaProjections.of(self), route=route,
            dims=SfaCacheDims(self.kv_lora_rank, self.qk_rope_head_dim, config.index_head_dim),
            rope_cos_sin=self.rotary_emb.cos_sin_cache, prefix=f"{prefix}.attn",
            impl_kwargs=dict(
                num_heads=self.num_local_heads, qk_nope_head_dim=self.qk_nope_head_dim,
                qk_rope_head_dim=self.qk_rope_head_dim, v_head_dim=self.v_head_dim,
                scale=scale, rms_eps=config.rms_norm_eps,
                indexer_spec=IndexerSpec(
                    n_heads=config.index_n_heads, head_dim=config.index_head_dim,
                    topk=config.index_topk,
                    neox=not getattr(config, "indexer_rope_interleave", False))))

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        out = hidden_states.new_empty(hidden_states.shape[0],
                                      self.num_local_heads * self.v_head_dim)
        self.attn(hidden_states, out)
        return self.o_proj(out)[0]


class DsaDecoderLayer(nn.Module):
    def __init__(self, vllm_config: VllmConfig, prefix: str) -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        idx = int(prefix.split(".")[-1])
        self.self_attn = DsaAttention(vllm_config, config, f"{prefix}.self_attn")
        moe = (getattr(config, "n_routed_experts", None) is not None
               and idx >= config.first_k_dense_replace
               and idx % getattr(config, "moe_layer_freq", 1) == 0)
        plugin = get_config(vllm_config)
        layer_ops = plugin.layer_ops
        if moe:
            self.mlp = DsaMoE(config=config, parallel_config=vllm_config.parallel_config,
                              quant_config=vllm_config.quant_config, prefix=f"{prefix}.mlp",
                              layer_ops=layer_ops, moe_dispatch=plugin.moe_dispatch)
        else:
            self.mlp = DsaMLP(layer_ops=layer_ops, hidden_size=config.hidden_size,
                              intermediate_size=config.intermediate_size,
                              hidden_act=config.hidden_act,
                              quant_config=vllm_config.quant_config, prefix=f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        # A dense W8A8 MLP takes the post-attention norm's int8 output (layers/norm_quant.py)
        self.fused_norm_quant = takes_fused_norm_quant(self.mlp, layer_ops)

    def forward(self, positions, hidden_states, residual):
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states)
        if self.fused_norm_quant:
            fused = mlp_after_norm(self.post_attention_layernorm, self.mlp, hidden_states,
                                   residual)
            if fused is not None:
                return fused
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class DsaModel(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        if get_pp_group().world_size > 1:
            raise NotImplementedError("ascend_ext DSA model: pipeline parallelism is not supported")
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size,
                                                   prefix=f"{prefix}.embed_tokens")
        self.start_layer, self.end_layer, self.layers = make_layers(
            config.num_hidden_layers, lambda prefix: DsaDecoderLayer(vllm_config, prefix),
            prefix=f"{prefix}.layers")
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, input_ids, positions, inputs_embeds=None):
        h = inputs_embeds if inputs_embeds is not None else self.embed_tokens(input_ids)
        residual = None
        for layer in self.layers[self.start_layer:self.end_layer]:
            h, residual = layer(positions, h, residual)
        h, _ = self.norm(h, residual)
        return h


class AscendDeepseekV32ForCausalLM(nn.Module):
    packed_modules_mapping = {
        "gate_up_proj": ["gate_proj", "up_proj"],
        "wk_weights_proj": ["wk", "weights_proj"],
    }

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        self.config = config = vllm_config.model_config.hf_config
        self.vllm_config = vllm_config
        self.model = DsaModel(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size,
                                      prefix=maybe_prefix(prefix, "lm_head"))
        self.logits_processor = LogitsProcessor(config.vocab_size)
        routes = Counter((a.route.preprocess, a.route.reason, a.route.prolog_op or "")
                         for a in self.sfa_layers())
        for (r, why, op), n in sorted(routes.items()):
            logger.info("ascend_ext SFA preprocessing: %d layer(s) -> %s (%s)%s", n, r, why,
                        f"; operator {op}" if op else "")

    def sfa_layers(self) -> list[SfaLayer]:
        return [m for m in self.modules() if isinstance(m, SfaLayer)]

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        return self.model(input_ids, positions, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.logits_processor(self.lm_head, hidden_states)

    def process_weights_after_loading(self) -> None:
        # vLLM's loader has already called each SfaLayer's own hook (attention layers).
        freed = sum(layer.weights.fallback_bytes_freed for layer in self.sfa_layers())
        if any(layer.route.dispose_fallback for layer in self.sfa_layers()):
            logger.info("ascend_ext SFA: native-chain weights of the fused-prolog layers: "
                        "%.2f MiB disposed%s", freed / 2**20,
                        "" if freed else " (the prolog shares the linears' NZ weights)")

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        # MTP / next-n layers (from num_hidden_layers on) are the drafter's (models/dsa_mtp.py)
        return load_dsa_weights(self, weights, skip_layers_from=self.config.num_hidden_layers)


def load_dsa_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]],
                     skip_layers_from: int | None) -> set[str]:
    """Load checkpoint tensors into ``model``'s parameters (stacked gate/up and indexer
    wk/weights_proj shards, per-expert weights); tensors of layers from
    ``skip_layers_from`` on are skipped. A tensor without a parameter is an error."""
    config = model.config
    stacked = [(".gate_up_proj.", ".gate_proj.", 0), (".gate_up_proj.", ".up_proj.", 1),
               (".wk_weights_proj.", ".wk.", 0), (".wk_weights_proj.", ".weights_proj.", 1)]
    experts = (fused_moe_make_expert_params_mapping(
        model, ckpt_gate_proj_name="gate_proj", ckpt_down_proj_name="down_proj",
        ckpt_up_proj_name="up_proj", num_experts=config.n_routed_experts,
        num_redundant_experts=0) if getattr(config, "n_routed_experts", None) else [])
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for name, w in weights:
        if "rotary_emb.inv_freq" in name:
            continue
        parts = name.split(".")
        if (skip_layers_from is not None and len(parts) > 2 and parts[1] == "layers"
                and int(parts[2]) >= skip_layers_from):
            continue
        for pname, sname, shard in stacked:
            if sname in name and ".mlp.experts." not in name:
                target = name.replace(sname, pname)
                if target in params:
                    params[target].weight_loader(params[target], w, shard)
                    loaded.add(target)
                    break
        else:
            for pname, wname, expert_id, shard in experts:
                if wname in name:
                    target = name.replace(wname, pname)
                    params[target].weight_loader(params[target], w, target, shard_id=shard,
                                                 expert_id=expert_id)
                    loaded.add(target)
                    break
            else:
                if name not in params:
                    raise KeyError(f"ascend_ext DSA model: checkpoint tensor {name!r} has no "
                                   "parameter")
                p = params[name]
                getattr(p, "weight_loader", default_weight_loader)(p, w)
                loaded.add(name)
    return loaded
