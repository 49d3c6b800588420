"""The emulated platform's KV-cache size when the user names none (emulation/kv_budget.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_ascend_ext.emulation import kv_budget

GiB, MiB = 1 << 30, 1 << 20


@pytest.mark.parametrize("per_token,max_len,available,workers,expected,capped", [
    (2048, 1024, 12 * GiB, 1, 1024 * MiB, False),      # tiny model: the 1 GiB floor
    (229376, 40960, 100 * GiB, 1, 35840 * MiB, False),  # 4 sequences of 40960 x 224 KiB
    (229376, 40960, 12 * GiB, 1, 6144 * MiB, True),     # half of the 12 GiB free
    (229376, 40960, 12 * GiB, 2, 3072 * MiB, True),     # ... shared by two workers
    (2048, 1024, 1 * GiB, 1, 512 * MiB, True),          # small machine
    (10**6, 1000, 3 * GiB + 12345, 1, 1536 * MiB, True),  # whole MiB
])
def test_choose(per_token, max_len, available, workers, expected, capped):
    budget = kv_budget.choose(per_token, max_len, available, workers)
    assert budget.nbytes == expected
    assert ("capped" in budget.reason) is capped
    assert ("over 2 workers" in budget.reason) is (workers == 2)


def _model(layers, heads, head_size, mla, dtype):
    return SimpleNamespace(get_num_layers=lambda p: layers, get_num_kv_heads=lambda p: heads,
                           get_head_size=lambda: head_size, use_mla=mla, dtype=dtype,
                           max_model_len=1024)


def test_per_token_bytes_counts_k_and_v_of_every_layer_in_the_cache_dtype():
    qwen3_8b = _model(36, 8, 128, False, torch.bfloat16)
    assert kv_budget.per_token_bytes(qwen3_8b, None, "auto") == 147456  # 144 KiB
    assert kv_budget.per_token_bytes(qwen3_8b, None, "bfloat16") == 147456
    fp32_model = _model(36, 8, 128, False, torch.float32)
    assert kv_budget.per_token_bytes(fp32_model, None, "auto") == 294912
    assert kv_budget.per_token_bytes(fp32_model, None, "float16") == 147456
    assert kv_budget.per_token_bytes(fp32_model, None, "fp8") == 73728
    deepseek = _model(61, 1, 576, True, torch.bfloat16)  # one latent row per layer
    assert kv_budget.per_token_bytes(deepseek, None, "auto") == 70272


def _vllm_config(tp=1, **cache_kwargs):
    from vllm.config import CacheConfig

    parallel = SimpleNamespace(tensor_parallel_size=tp, pipeline_parallel_size=1,
                               data_parallel_size_local=1)
    return SimpleNamespace(cache_config=CacheConfig(**cache_kwargs),
                           model_config=_model(2, 2, 64, False, torch.float32),
                           parallel_config=parallel)


def test_applied_only_when_the_user_chose_no_size(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    cfg = _vllm_config()
    budget = kv_budget.apply(cfg, available_bytes=8 * GiB)
    assert budget is not None and cfg.cache_config.kv_cache_memory_bytes == GiB
    assert kv_budget.apply(cfg, available_bytes=8 * GiB) is None  # idempotent: now chosen

    tp4 = _vllm_config(tp=4)
    assert kv_budget.apply(tp4, available_bytes=4 * GiB).nbytes == 512 * MiB  # 2 GiB / 4

    for chosen in (_vllm_config(kv_cache_memory_bytes=3 * GiB),
                   _vllm_config(gpu_memory_utilization=0.5)):
        before = chosen.cache_config.kv_cache_memory_bytes
        assert kv_budget.apply(chosen, available_bytes=8 * GiB) is None
        assert chosen.cache_config.kv_cache_memory_bytes == before

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    env_chosen = _vllm_config()
    assert kv_budget.apply(env_chosen, available_bytes=8 * GiB) is None
    assert env_chosen.cache_config.kv_cache_memory_bytes is None  # vLLM applies the variable
