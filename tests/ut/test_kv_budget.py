"""The emulated platform's KV-cache size when the user names none (platform/kv_budget.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_ascend_ext.platform import kv_budget

GiB, MiB = 1 << 30, 1 << 20


@pytest.mark.parametrize("per_token,max_len,available,expected", [
    (2048, 1024, 12 * GiB, 1 * GiB),                       # tiny model: the 1 GiB floor
    (229376, 40960, 100 * GiB, 4 * 40960 * 229376 // MiB * MiB),  # 4 full sequences
    (229376, 40960, 12 * GiB, 6 * GiB),                    # capped at half the free memory
    (2048, 1024, 1 * GiB, 512 * MiB),                      # small machine: half of what is free
])
def test_choose(per_token, max_len, available, expected):
    budget = kv_budget.choose(per_token, max_len, available)
    assert budget.nbytes == expected
    assert budget.nbytes % MiB == 0
    assert ("capped" in budget.reason) == (expected < max(GiB, 4 * max_len * per_token))


def test_per_token_bytes_counts_k_and_v_of_every_layer():
    model = SimpleNamespace(get_num_layers=lambda p: 28, get_num_kv_heads=lambda p: 8,
                            get_head_size=lambda: 128, use_mla=False, dtype=torch.bfloat16)
    assert kv_budget.per_token_bytes(model, None, "auto") == 28 * 8 * 128 * 2 * 2
    assert kv_budget.per_token_bytes(model, None, "fp8") == 28 * 8 * 128 * 2 * 1
    mla = SimpleNamespace(get_num_layers=lambda p: 61, get_num_kv_heads=lambda p: 1,
                          get_head_size=lambda: 576, use_mla=True, dtype=torch.bfloat16)
    assert kv_budget.per_token_bytes(mla, None, "auto") == 61 * 576 * 2


def _vllm_config(**cache_kwargs):
    from vllm.config import CacheConfig

    model = SimpleNamespace(get_num_layers=lambda p: 2, get_num_kv_heads=lambda p: 2,
                            get_head_size=lambda: 64, use_mla=False, dtype=torch.float32,
                            max_model_len=1024)
    return SimpleNamespace(cache_config=CacheConfig(**cache_kwargs), model_config=model,
                           parallel_config=None)


def test_applied_only_when_the_user_chose_no_size(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    cfg = _vllm_config()
    budget = kv_budget.apply(cfg, available_bytes=8 * GiB)
    assert budget is not None and cfg.cache_config.kv_cache_memory_bytes == GiB
    assert kv_budget.apply(cfg, available_bytes=8 * GiB) is None  # idempotent: now chosen

    for chosen in (_vllm_config(kv_cache_memory_bytes=3 * GiB),
                   _vllm_config(gpu_memory_utilization=0.5)):
        before = chosen.cache_config.kv_cache_memory_bytes
        assert kv_budget.apply(chosen, available_bytes=8 * GiB) is None
        assert chosen.cache_config.kv_cache_memory_bytes == before

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    env_chosen = _vllm_config()
    assert kv_budget.apply(env_chosen, available_bytes=8 * GiB) is None
    assert env_chosen.cache_config.kv_cache_memory_bytes is None  # vLLM applies the variable
