"""Backend selection shared by the NPU and the emulated platform.

Validates the layer's needs against the backend's declared capabilities and
raises before any weight is loaded when the backend cannot compute them.
"""

from __future__ import annotations

from vllm.logger import init_logger

from vllm_ascend_ext.errors import AscendExtError
from vllm_ascend_ext.platform.facts import ModelFacts, facts_of
from vllm_ascend_ext.platform.soc import Soc

logger = init_logger("vllm.ascend_ext")

FIA_BACKEND_PATH = "vllm_ascend_ext.attention.fia.backend.AscendFIABackend"
SFA_BACKEND_PATH = "vllm_ascend_ext.attention.sfa.backend.AscendSFABackend"


class UnsupportedAttentionError(AscendExtError):
    pass


def select_attention_backend(platform_name: str, soc: Soc, selector_config,
                             device_capability=None, log: bool = True) -> str:
    # Imported here: the platform class is loaded while vllm.platforms initializes.
    from vllm_ascend_ext.attention.fia.backend import AscendFIABackend
    from vllm_ascend_ext.attention.sfa.backend import AscendSFABackend

    cfg = selector_config
    if cfg.use_mla != cfg.use_sparse:
        raise UnsupportedAttentionError(
            f"ascend_ext ({platform_name}): dense MLA (use_mla={cfg.use_mla}, "
            f"use_sparse={cfg.use_sparse}) has no backend in this version of the plugin; "
            "served are standard decoder attention (GQA/MHA, backend ASCEND_EXT_FIA) and "
            "DeepSeek-V3.2-style sparse MLA (ASCEND_EXT_SFA)"
        )
    backend, path = ((AscendSFABackend, SFA_BACKEND_PATH) if cfg.use_mla
                     else (AscendFIABackend, FIA_BACKEND_PATH))
    name = backend.get_name()
    # vLLM's selector config, whole: its fields are validate_configuration's keywords (as
    # vLLM's CUDA platform passes them), so a field vLLM adds reaches the backend too.
    reasons = backend.validate_configuration(device_capability=device_capability,
                                             **cfg._asdict())
    if reasons:
        raise UnsupportedAttentionError(
            f"ascend_ext ({platform_name}): backend {name} cannot serve this "
            f"attention layer: {'; '.join(reasons)} (head_size={cfg.head_size}, "
            f"dtype={cfg.dtype}, kv_cache_dtype={cfg.kv_cache_dtype}, "
            f"block_size={cfg.block_size}, attn_type={cfg.attn_type}); {name} serves "
            f"{what_it_serves(backend)}"
        )
    if log:
        logger.info_once(
            "ascend_ext: platform=%s soc=%s (%s) attention_backend=%s",
            platform_name, soc.name, soc.family, name,
        )
    return path


def what_it_serves(backend) -> str:
    """The backend's declared limits, in the words of vLLM's options."""
    from vllm.v1.attention.backend import MultipleOf

    sizes = backend.get_supported_kernel_block_sizes()
    ints = [b for b in sizes if isinstance(b, int)]
    if len(ints) > 2 and ints == list(range(ints[0], ints[-1] + 1, ints[0])):
        blocks = (f"multiples of {ints[0]} up to {ints[-1]} (larger blocks are split into "
                  f"kernel blocks)")
    else:
        blocks = ", ".join(f"multiples of {b.base}" if isinstance(b, MultipleOf) else str(b)
                           for b in sizes)
    parts = [f"--block-size {blocks}",
             f"--kv-cache-dtype {', '.join(backend.supported_kv_cache_dtypes)}",
             f"--dtype {', '.join(str(d).removeprefix('torch.') for d in backend.supported_dtypes)}"]
    if backend.get_supported_head_sizes():
        parts.insert(0, "head sizes " + ", ".join(map(str, backend.get_supported_head_sizes())))
    parts.append("causal decoder self-attention without sinks or sliding windows, "
                 "no prefill/decode context parallelism")
    return "; ".join(parts)


def preflight(platform_name: str, soc: Soc, vllm_config, facts: ModelFacts | None = None) -> None:
    """Check the model's attention against the backend before the engine starts.

    Model-wide facts only (MLA/sparse, head size, dtype, KV-cache dtype, block size,
    non-causal, context parallelism, KV transfer): a refusal then reaches the user as
    one line from the config step, instead of from deep inside the engine process.
    Per-layer facts the config does not settle (sinks, sliding windows: some configs
    carry a window they do not use, encoder layers) are checked when each layer asks.
    ``facts``: the start's (``platform/facts.py``); the model's own when not given.
    """
    from vllm import envs
    from vllm.v1.attention.selector import AttentionSelectorConfig

    mc, cache = vllm_config.model_config, vllm_config.cache_config
    facts = facts_of(vllm_config, facts)
    if not facts.present or facts.attention_free:
        return
    kv_transfer = vllm_config.kv_transfer_config
    parallel = vllm_config.parallel_config
    config = AttentionSelectorConfig(
        head_size=facts.head_size,
        dtype=mc.dtype,
        kv_cache_dtype=cache.cache_dtype,
        block_size=cache.block_size if cache.user_specified_block_size else None,
        use_mla=facts.use_mla,
        use_sparse=facts.sparse_mla,
        use_non_causal=vllm_config.attention_config.use_non_causal,
        use_batch_invariant=envs.VLLM_BATCH_INVARIANT,
        use_kv_connector=kv_transfer is not None and kv_transfer.is_kv_transfer_instance,
        use_pcp=parallel.prefill_context_parallel_size > 1,
        use_dcp=parallel.decode_context_parallel_size > 1,
    )
    select_attention_backend(platform_name, soc, config, log=False)
    if not config.use_mla:
        refuse_tnd_head_dims(platform_name, mc, parallel, facts.head_size)


def refuse_tnd_head_dims(platform_name: str, model_config, parallel_config,
                         head_size: int) -> None:
    """FIA's TND layout takes head sizes above 192 only for GQA on each rank (its
    split-fuse path; ``ops/fia_checks.py``): refused before the engine starts."""
    from vllm_ascend_ext.ops.fia_checks import tnd_head_dims_refusal

    heads = model_config.get_num_attention_heads(parallel_config)
    kv_heads = model_config.get_num_kv_heads(parallel_config)
    why = tnd_head_dims_refusal(head_size, head_size, heads, kv_heads)
    if why:
        tp = parallel_config.tensor_parallel_size
        raise UnsupportedAttentionError(
            f"ascend_ext ({platform_name}): {why} (model: {model_config.get_total_num_kv_heads()}"
            f" KV heads, {heads} query and {kv_heads} KV heads per rank at "
            f"--tensor-parallel-size {tp}); use a tensor-parallel size that leaves each rank "
            "fewer KV heads than query heads")
