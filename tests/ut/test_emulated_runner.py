"""The emulated runner's KV-block zeroing (``worker/emulated_runner.py``): each scheduler
block's kernel blocks, never another block's."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend_ext.worker.emulated_runner import kernel_rows


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
