"""Torch substitutes for the Triton kernels vLLM's GPU runner launches, on the NPU.

vLLM 0.32 routes its core Triton kernels through a registry
(``vllm.triton_utils.dispatcher.register_kernels``), and each platform may register its
own implementations (``Platform.register_triton_kernel_overrides``, called in every
worker): vLLM's CPU platform registers C++/torch ones. On an Atlas host without a
working triton-ascend the originals are placeholders that fail on the first step, so the
NPU platform registers the substitutes below: device-generic torch, no host sync, the
kernels' own argument order. Every kernel the CPU platform overrides is either
substituted here (``SUBSTITUTES``) or kept off the NPU path (``UNREACHED``, each with
the check that keeps it off); ``tests/ut/test_kernel_substitutes.py`` holds vLLM's list
to that. vLLM's KV-block zeroing kernel, outside the registry, is replaced by the NPU
runner's ``_zero_block_ids`` (``worker/kv_zeroing.py``).
"""

from __future__ import annotations

import torch

SLOT_MAPPING = "vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel"


def compute_slot_mapping(num_tokens: int, max_num_tokens: int, query_start_loc: torch.Tensor,
                         positions: torch.Tensor, block_table: torch.Tensor,
                         block_table_stride: int, slot_mapping: torch.Tensor,
                         KV_CACHE_BLOCK_SIZE: int, TOTAL_CP_WORLD_SIZE: int = 1,  # noqa: N803
                         TOTAL_CP_RANK: int = 0, CP_KV_CACHE_INTERLEAVE_SIZE: int = 1,  # noqa: N803
                         PAD_ID: int = -1, BLOCK_SIZE: int = 1024) -> None:  # noqa: N803
    """``block_table.ComputeSlotMappingKernel.kernel``: each scheduled token's KV slot
    ``block_table[req, pos // B] * B + pos % B`` (with context parallelism: the virtual
    block of ``B * world`` positions, ``PAD_ID`` for positions another rank holds), then
    ``PAD_ID`` up to ``max_num_tokens``. ``query_start_loc`` is ``[num_reqs + 1]``."""
    size, world, rank, inter = KV_CACHE_BLOCK_SIZE, TOTAL_CP_WORLD_SIZE, TOTAL_CP_RANK, \
        CP_KV_CACHE_INTERLEAVE_SIZE
    device = slot_mapping.device
    tokens = torch.arange(num_tokens, device=device, dtype=torch.int64)
    ends = query_start_loc[1:].to(torch.int64)
    req = torch.searchsorted(ends, tokens, right=True)
    pos = positions[:num_tokens].to(torch.int64)
    virtual = size * world
    vblock = pos // virtual
    voff = pos - vblock * virtual
    local = (voff // inter) % world == rank
    loff = (voff // (world * inter)) * inter + voff % inter
    index = torch.where(local, req * block_table_stride + vblock, 0)
    blocks = block_table.reshape(-1)[index].to(torch.int64)
    slot_mapping[:num_tokens] = torch.where(local, blocks * size + loff, PAD_ID)
    slot_mapping[num_tokens:max_num_tokens] = PAD_ID


SUBSTITUTES = {SLOT_MAPPING: compute_slot_mapping}

_DRAFTERS = ("the drafter's input kernels have no NPU substitute yet: the NPU platform "
             "refuses EAGLE/MTP/DFlash/draft-model speculation (platform/npu.py)")
_SAMPLER = ("the rejection sampler's kernels have no NPU substitute yet: the NPU platform "
            "refuses speculative decoding (platform/npu.py)")
UNREACHED = {
    "vllm.v1.spec_decode.utils.eagle_step_slot_mapping_metadata_kernel": _DRAFTERS,
    "vllm.v1.spec_decode.utils.eagle_prepare_inputs_padded_kernel": _DRAFTERS,
    "vllm.v1.spec_decode.utils.eagle_prepare_next_token_padded_kernel": _DRAFTERS,
    "vllm.v1.spec_decode.utils.copy_and_expand_eagle_inputs_kernel": _DRAFTERS,
    "vllm.v1.spec_decode.utils.copy_and_expand_dflash_inputs_kernel": _DRAFTERS,
    "vllm.v1.sample.rejection_sampler.rejection_greedy_sample_kernel": _SAMPLER,
    "vllm.v1.sample.rejection_sampler.rejection_random_sample_kernel": _SAMPLER,
    "vllm.v1.sample.rejection_sampler.expand_kernel": _SAMPLER,
    "vllm.v1.sample.rejection_sampler.sample_recovered_tokens_kernel": _SAMPLER,
    "vllm.v1.worker.mamba_utils.batch_memcpy_kernel": (
        "mamba state copies run in the 'align' cache mode (hybrid prefix caching) only, "
        "which both platforms turn off (config_hooks.hybrid_prefix_caching_off)"),
}


def register() -> None:
    """Register the substitutes with vLLM's kernel registry (idempotent). Over vLLM's CPU
    overrides too: the emulated platform runs the NPU's substitutes, so every emulated
    step checks them against the references end to end."""
    import logging

    from vllm.triton_utils.dispatcher import _registry, register_kernels

    todo = {name: impl for name, impl in SUBSTITUTES.items()
            if _registry.get(name, (None, None))[1] is not impl}
    if not todo:
        return
    # vLLM warns when a registered override is replaced; replacing the CPU platform's
    # is this function's purpose, not a conflict.
    quiet = logging.getLogger("vllm.triton_utils.dispatcher")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        register_kernels(todo)
    finally:
        quiet.setLevel(level)
