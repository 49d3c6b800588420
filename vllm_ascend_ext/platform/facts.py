"""What the start-up steps need to know about the model, read once per start.

``startup.run`` computes :class:`ModelFacts` once, after the platform's own checks, and
hands the same frozen value to every step that asks (graph mode, block sizes, hybrid
prefix caching, the preflight). A step called on its own (a unit test, the CLI) passes no
facts and gets the model's own (``facts_of``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelFacts:
    present: bool = False         # a model config at all (vLLM builds some configs without)
    attention_free: bool = False  # no attention layer (the preflight has nothing to check)
    use_mla: bool = False         # vLLM's MLA path (one latent row per token)
    sparse_mla: bool = False      # MLA with a lightning indexer: the SFA backend
    hybrid: bool = False          # linear attention beside full attention (Gated-DeltaNet)
    head_size: int | None = None  # vLLM's head size (MLA: the latent row); None: no attention


NO_MODEL = ModelFacts()


def is_sparse_mla_model(model_config) -> bool:
    """DeepSeek-V3.2 / GLM-5 style: MLA with a lightning indexer (``index_topk``)."""
    if model_config is None or not getattr(model_config, "use_mla", False):
        return False
    # The text config, where vLLM reads use_mla from (a wrapper config nests it).
    text = getattr(model_config, "hf_text_config", None) or model_config.hf_config
    return hasattr(text, "index_topk")


def model_facts(model_config) -> ModelFacts:
    """The facts of vLLM's ``ModelConfig`` (or of none)."""
    if model_config is None:
        return NO_MODEL
    attention_free = bool(getattr(model_config, "is_attention_free", False))
    return ModelFacts(
        present=True,
        attention_free=attention_free,
        use_mla=bool(getattr(model_config, "use_mla", False)),
        sparse_mla=is_sparse_mla_model(model_config),
        hybrid=bool(getattr(model_config, "is_hybrid", False)),
        head_size=None if attention_free else model_config.get_head_size(),
    )


def facts_of(vllm_config, facts: ModelFacts | None = None) -> ModelFacts:
    """This start's facts when given, else (a step called on its own) the model's."""
    return facts if facts is not None else model_facts(vllm_config.model_config)
