"""Qwen3-Next with its ``tie_word_embeddings`` honoured.

vLLM 0.32's ``Qwen3NextForCausalLM`` builds ``lm_head`` as a parameter of its own and
never ties it, whatever the config says (its sibling ``Qwen3_5ForCausalLM`` does tie). A
checkpoint saved with tied embeddings stores one matrix, ``embed_tokens``, so vLLM serves
an ``lm_head`` that was never loaded: every logit is wrong, silently (transformers ties
them). The plugin registers this subclass for the architecture while its platform is
active: identical to vLLM's class except that a tied config shares the embedding matrix
(``docs/hybrid.md``, "Upstream differences"). Untied checkpoints (the published Qwen3-Next
models) take exactly vLLM's path.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from vllm.model_executor.models.qwen3_next import Qwen3NextForCausalLM


class AscendQwen3NextForCausalLM(Qwen3NextForCausalLM):
    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        if getattr(self.config, "tie_word_embeddings", False):
            self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        if getattr(self.config, "tie_word_embeddings", False):
            # A tied checkpoint may still carry a copy: the embedding matrix is the one.
            weights = ((name, w) for name, w in weights if not name.startswith("lm_head."))
        return super().load_weights(weights)
