"""KV-block zeroing by scheduler block, for both platforms' model runners.

vLLM zeroes a hybrid model's newly allocated full-attention blocks before use (stale
bytes of a state block must not be read as keys). Its CPU runner indexes each layer's
cache with the scheduler's block id (``kv[block_id].zero_()``), which is right only while
the kernel block equals the scheduler's block. FIA takes blocks of at most 512 tokens, so
a larger scheduler block (a hybrid model aligns its attention page to the mamba page) is
served as several kernel blocks (``get_supported_kernel_block_sizes``), the cache is
viewed in kernel blocks, and the CPU runner then zeroes the wrong memory: the first
kernel block of another block, often another request's keys. This runner zeroes every
kernel block of each scheduler block, as vLLM's GPU zeroer does (``KVBlockZeroer``,
whose Triton kernel has no NPU build either): ``EmulatedAscendModelRunner`` (vLLM's CPU
runner) and the NPU runner both zero through :func:`zero_blocks`, slicing the caches.
"""

from __future__ import annotations

import torch
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.worker.cpu_model_runner import CPUModelRunner


def kernel_rows(block_ids: list[int], kernel_blocks: int, manager_blocks: int) -> list[range]:
    """The kernel-block rows of each scheduler block, for a cache of ``kernel_blocks``
    rows that holds ``manager_blocks`` scheduler blocks (kernel blocks contiguous)."""
    if manager_blocks <= 0 or kernel_blocks % manager_blocks:
        raise ValueError(f"{kernel_blocks} kernel blocks do not split {manager_blocks} "
                         "scheduler blocks evenly")
    ratio = kernel_blocks // manager_blocks
    return [range(b * ratio, (b + 1) * ratio) for b in block_ids]


def zero_blocks(runner, block_ids: list[int]) -> None:
    """Zero every kernel block of the scheduler blocks ``block_ids`` in each full-attention
    layer's cache of ``runner`` (a vLLM V1 model runner); no host sync (the ids are the
    scheduler's host list)."""
    if not block_ids:
        return
    seen: set[int] = set()
    context = runner.compilation_config.static_forward_context
    for group in runner.kv_cache_config.kv_cache_groups:
        if not isinstance(group.kv_cache_spec, FullAttentionSpec):
            continue
        for name in group.layer_names:
            kv = getattr(context.get(name), "kv_cache", None)
            if not isinstance(kv, torch.Tensor) or kv.data_ptr() in seen:
                continue
            seen.add(kv.data_ptr())
            rows = [r for span in kernel_rows(block_ids, kv.shape[0],
                                              runner.kv_cache_config.num_blocks) for r in span]
            # one launch per layer (a host list to the device: no device-to-host sync)
            kv.index_fill_(0, torch.tensor(rows, device=kv.device), 0)


class EmulatedAscendModelRunner(CPUModelRunner):
    """The emulated platform's runner: vLLM's CPU runner, new KV blocks zeroed by
    scheduler block."""

    def _zero_block_ids(self, block_ids: list[int]) -> None:
        zero_blocks(self, block_ids)
