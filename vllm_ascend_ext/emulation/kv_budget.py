"""KV-cache size of the emulated platform when the user names none.

vLLM's CPU worker, given no KV-cache size, reserves ``gpu_memory_utilization`` (0.92)
of the machine's RAM and refuses to start when that much is not free right now, so on
an ordinary machine every command fails until the user finds ``VLLM_CPU_KVCACHE_SPACE``.
Emulation serves small models on a shared CPU; when neither ``VLLM_CPU_KVCACHE_SPACE``,
``--kv-cache-memory-bytes`` nor a non-default ``--gpu-memory-utilization`` is given, the
emulated platform sizes the cache itself (pure rule below) and logs it once.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

GiB = 1 << 30
MiB = 1 << 20
MIN_BYTES = 1 * GiB  # enough for any embedded tiny model at any length it supports
FULL_SEQUENCES = 4  # room for this many max_model_len sequences at once
AVAILABLE_FRACTION = 0.5  # never more than this share of the memory free at startup
ENV_VAR = "VLLM_CPU_KVCACHE_SPACE"


@dataclass(frozen=True)
class KvBudget:
    nbytes: int
    reason: str


def choose(per_token_bytes: int, max_model_len: int, available_bytes: int,
           local_workers: int = 1) -> KvBudget:
    """Per worker: room for FULL_SEQUENCES full-length sequences (at least MIN_BYTES),
    capped at AVAILABLE_FRACTION of the free memory shared by the ``local_workers`` that
    each allocate this much; rounded down to whole MiB."""
    want = max(MIN_BYTES, FULL_SEQUENCES * max_model_len * per_token_bytes)
    cap = int(available_bytes * AVAILABLE_FRACTION) // max(1, local_workers)
    nbytes = max(MiB, min(want, cap) // MiB * MiB)
    if want <= cap:
        reason = (f"{FULL_SEQUENCES} sequences of max_model_len {max_model_len} at "
                  f"{per_token_bytes} B/token, at least {MIN_BYTES / GiB:.0f} GiB")
    else:
        share = f" over {local_workers} workers" if local_workers > 1 else ""
        reason = (f"capped at {AVAILABLE_FRACTION:.0%} of the {available_bytes / GiB:.2f} GiB "
                  f"available{share} (wanted {want / GiB:.2f} GiB for {FULL_SEQUENCES} "
                  f"sequences of max_model_len {max_model_len})")
    return KvBudget(nbytes, reason)


def per_token_bytes(model_config, parallel_config, cache_dtype: str) -> int:
    """An estimate of the KV bytes per token over all layers: K and V (MLA: one latent
    row of vLLM's head size; the SFA layer's indexer-key cache adds 22% more for
    DeepSeek-V3.2); hybrid models' linear-attention layers are counted as if they held a
    per-token cache."""
    from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype

    layers = model_config.get_num_layers(parallel_config)
    heads = model_config.get_num_kv_heads(parallel_config)
    planes = 1 if model_config.use_mla else 2
    itemsize = kv_cache_dtype_str_to_dtype(cache_dtype, model_config).itemsize
    return layers * heads * model_config.get_head_size() * planes * itemsize


def user_chose_size(cache_config) -> bool:
    """True when the user named a KV-cache size in any of vLLM's ways."""
    if os.environ.get(ENV_VAR, "") != "" or cache_config.kv_cache_memory_bytes is not None:
        return True
    field = next(f for f in dataclasses.fields(type(cache_config))
                 if f.name == "gpu_memory_utilization")
    default = getattr(field.default, "default", field.default)  # pydantic Field(default=...)
    return cache_config.gpu_memory_utilization != default


def from_env(cache_config, environ=os.environ) -> bool:
    """vLLM's CPU variable for the KV-cache size (``VLLM_CPU_KVCACHE_SPACE``, GiB), which the
    emulated platform reads as vLLM's CPU platform does: True when it set the size."""
    raw = environ.get(ENV_VAR, "")
    if raw == "" or cache_config.kv_cache_memory_bytes is not None:
        return False
    try:
        cache_config.kv_cache_memory_bytes = int(raw) * GiB
    except ValueError:
        from vllm_ascend_ext.errors import AscendExtError

        raise AscendExtError(f"{ENV_VAR}={raw!r}: expected a whole number of GiB") from None
    return True


def apply(vllm_config, available_bytes: int) -> KvBudget | None:
    """Set ``kv_cache_memory_bytes`` unless the user chose a size; the budget, or None."""
    cache = vllm_config.cache_config
    model = vllm_config.model_config
    if model is None or user_chose_size(cache):
        return None
    parallel = vllm_config.parallel_config
    per_token = per_token_bytes(model, parallel, cache.cache_dtype)
    local_workers = parallel.tensor_parallel_size * parallel.pipeline_parallel_size * max(
        1, parallel.data_parallel_size_local or 1)
    budget = choose(per_token, model.max_model_len, available_bytes, local_workers)
    cache.kv_cache_memory_bytes = budget.nbytes
    return budget
