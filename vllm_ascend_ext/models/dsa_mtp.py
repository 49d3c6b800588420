"""DeepSeek-V3.2 / GLM-5 MTP layers (``--speculative-config '{"method": "mtp"}'``) on the
plugin's SFA backend.

For a DSA model vLLM 0.32's speculative config names the draft architecture
``DeepseekV32MTPModel``, whose layers are vLLM's own DeepSeek decoder layers: its
sparse-attention modules and Triton indexer, not the plugin's. While the plugin's platform
is active the plugin registers this class for that architecture instead: each next-n layer
is the plugin's DSA decoder layer (``models/deepseek_v32.DsaDecoderLayer``: an
``SfaLayer`` with its own caches, the plugin's MoE) plus DeepSeek's MTP head, with the
checkpoint's names (``model.layers.{N}.enorm`` / ``hnorm`` / ``eh_proj`` /
``shared_head.norm``, N from ``num_hidden_layers`` on). The forward is DeepSeek's:

    e = enorm(embed(token at t + 1))  (zero at position 0),   h = hnorm(hidden at t)
    x = decoder(eh_proj([e, h]));     logits = head(shared_head.norm(x))

returning ``(x, shared_head.norm(x))``: vLLM's proposer recycles the normed hidden state
into the next draft step (``model_returns_tuple``). ``embed_tokens`` and
``shared_head.head`` are the main model's, shared by vLLM's proposer (a checkpoint's own
copies load when present).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import ReplicatedLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)
from vllm.model_executor.models.utils import maybe_prefix

from vllm_ascend_ext.attention.sfa.layer import SfaLayer
from vllm_ascend_ext.models.deepseek_v32 import (
    AscendDeepseekV32ForCausalLM,
    DsaDecoderLayer,
    load_dsa_weights,
)


class SharedHead(nn.Module):
    def __init__(self, config, prefix: str) -> None:
        super().__init__()
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.head = ParallelLMHead(config.vocab_size, config.hidden_size,
                                   prefix=f"{prefix}.head")

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.norm(hidden_states)


class DsaMtpLayer(DsaDecoderLayer):
    """One next-n layer: the plugin's DSA decoder layer under ``model.layers.{N}`` and the
    MTP head around it."""

    def __init__(self, vllm_config: VllmConfig, prefix: str) -> None:
        super().__init__(vllm_config, prefix)
        config = vllm_config.model_config.hf_config
        h = config.hidden_size
        self.enorm = RMSNorm(h, eps=config.rms_norm_eps)
        self.hnorm = RMSNorm(h, eps=config.rms_norm_eps)
        self.eh_proj = ReplicatedLinear(2 * h, h, bias=False, quant_config=None,
                                        prefix=f"{prefix}.eh_proj")
        self.shared_head = SharedHead(config, f"{prefix}.shared_head")

    def predict(self, positions: torch.Tensor, previous_hidden: torch.Tensor,
                inputs_embeds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inputs_embeds = torch.where(positions.unsqueeze(-1) == 0, 0, inputs_embeds)
        x = torch.cat([self.enorm(inputs_embeds), self.hnorm(previous_hidden)], dim=-1)
        hidden, residual = self(positions, self.eh_proj(x)[0], None)
        hidden = residual + hidden
        return hidden, self.shared_head(hidden)


class DsaMtpModel(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.mtp_start_layer_idx = config.num_hidden_layers
        self.num_mtp_layers = config.num_nextn_predict_layers
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size,
                                                   prefix=f"{prefix}.embed_tokens")
        self.layers = nn.ModuleDict({
            str(i): DsaMtpLayer(vllm_config, f"{prefix}.layers.{i}")
            for i in range(self.mtp_start_layer_idx,
                           self.mtp_start_layer_idx + self.num_mtp_layers)})

    def layer(self, spec_step_idx: int) -> DsaMtpLayer:
        return self.layers[str(self.mtp_start_layer_idx + spec_step_idx % self.num_mtp_layers)]


class AscendDsaMTP(nn.Module):
    """vLLM's ``DeepseekV32MTPModel`` interface on the plugin's DSA layers."""

    packed_modules_mapping = AscendDeepseekV32ForCausalLM.packed_modules_mapping

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        self.config = vllm_config.model_config.hf_config
        self.vllm_config = vllm_config
        self.model = DsaMtpModel(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        self.logits_processor = LogitsProcessor(self.config.vocab_size)

    def sfa_layers(self) -> list[SfaLayer]:
        return [m for m in self.modules() if isinstance(m, SfaLayer)]

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(self, input_ids, positions, hidden_states, intermediate_tensors=None,
                inputs_embeds=None, spec_step_idx: int = 0):
        if inputs_embeds is None:
            inputs_embeds = self.embed_input_ids(input_ids)
        return self.model.layer(spec_step_idx).predict(positions, hidden_states, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor, spec_step_idx: int = 0):
        layer = self.model.layer(spec_step_idx)
        return self.logits_processor(layer.shared_head.head, layer.shared_head(hidden_states))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The next-n layers' tensors (and the main model's ``embed_tokens``, which the
        proposer replaces by the target's anyway); everything else is the main model's."""
        first = self.model.mtp_start_layer_idx
        mine = {str(i) for i in range(first, first + self.model.num_mtp_layers)}

        def own(name: str) -> bool:
            parts = name.split(".")
            return (name == "model.embed_tokens.weight"
                    or (len(parts) > 2 and parts[1] == "layers" and parts[2] in mine))
        return load_dsa_weights(self, ((n, w) for n, w in weights if own(n)),
                                skip_layers_from=None)
