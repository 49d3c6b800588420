"""The emulated runner's KV-block zeroing (``worker/kv_zeroing.py``): each scheduler
block's kernel blocks, never another block's."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend_ext.worker.kv_zeroing import kernel_rows


def test_kernel_rows_cover_each_scheduler_block_and_nothing_else():
    # 4 scheduler blocks of 1024 tokens seen as 8 kernel blocks of 512
    cache = torch.arange(8.0)
    for rows in kernel_rows([1, 3], kernel_blocks=8, manager_blocks=4):
        cache[rows.start:rows.stop] = -1
    assert cache.tolist() == [0, 1, -1, -1, 4, 5, -1, -1]
    # unsplit: one row per block (what vLLM's CPU runner assumes everywhere)
    assert kernel_rows([2], 4, 4) == [range(2, 3)]
    with pytest.raises(ValueError, match="do not split 3 scheduler blocks evenly"):
        kernel_rows([0], 8, 3)


def test_zero_blocks_clears_each_new_blocks_kernel_blocks_in_every_full_attention_layer():
    from types import SimpleNamespace

    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    from vllm_ascend_ext.worker.kv_zeroing import zero_blocks

    spec = FullAttentionSpec(block_size=32, num_kv_heads=1, head_size=4, dtype=torch.float32)
    caches = {name: torch.ones(8, 1, 16, 8) for name in ("a", "b")}   # 4 blocks as 8 kernel
    state = torch.ones(4, 3)
    runner = SimpleNamespace(
        compilation_config=SimpleNamespace(static_forward_context={
            "a": SimpleNamespace(kv_cache=caches["a"]), "b": SimpleNamespace(kv_cache=caches["b"]),
            "m": SimpleNamespace(kv_cache=state)}),
        kv_cache_config=SimpleNamespace(num_blocks=4, kv_cache_groups=[
            SimpleNamespace(kv_cache_spec=spec, layer_names=["a", "b"]),
            SimpleNamespace(kv_cache_spec=MambaSpec(shapes=((3,),), dtypes=(torch.float32,),
                                                    block_size=32), layer_names=["m"])]))
    zero_blocks(runner, [2])
    for kv in caches.values():
        per_row = kv.flatten(1).sum(1).tolist()
        assert per_row == [128.0] * 4 + [0.0, 0.0] + [128.0] * 2   # kernel rows 4, 5
    assert state.sum() == 12                                     # state blocks untouched
