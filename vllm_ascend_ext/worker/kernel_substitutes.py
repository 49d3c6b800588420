"""Torch substitutes for the Triton kernels vLLM's GPU runner launches, on the NPU.

vLLM 0.32 routes its core Triton kernels through a registry
(``vllm.triton_utils.dispatcher.register_kernels``), and each platform may register its
own implementations (``Platform.register_triton_kernel_overrides``, called in every
worker): vLLM's CPU platform registers C++/torch ones. On an Atlas host without a
working triton-ascend the originals are placeholders that fail on the first step, so the
NPU platform registers the substitutes below: device-generic torch, no host sync, the
kernels' own argument order. Every kernel the CPU platform overrides is either
substituted here (``SUBSTITUTES``) or kept off the NPU path (``UNREACHED``, each with
the check that keeps it off); ``tests/ut/worker/test_kernel_substitutes.py`` holds vLLM's list
to that. ``batch_memcpy_kernel`` (hybrid prefix caching's state copies) takes the
address lists the NPU runner keeps on the host (``worker/mamba_state_copy.py``); the
drafters' (EAGLE, MTP, DFlash) input kernels live in ``worker/drafter_substitutes.py``. Outside
the registry: vLLM's KV-block zeroing kernel, replaced by the NPU runner's
``_zero_block_ids`` (``worker/kv_zeroing.py``), and its fused align-mode copies under
speculation, replaced by the runner's ``AlignSpecCopies`` (``worker/mamba_spec_copies.py``).
"""

from __future__ import annotations

import torch

from vllm_ascend_ext.worker.drafter_substitutes import SUBSTITUTES as DRAFTER_SUBSTITUTES
from vllm_ascend_ext.worker.mamba_state_copy import BATCH_MEMCPY, batch_memcpy

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


# -- the rejection sampler's kernels (speculative decoding) ---------------------------------
# Each request ``r`` owns draft tokens ``[cu[r-1], cu[r])``; its output row is
# ``max_spec_len + 1`` wide. Vectorised over tokens, without host reads.

def _token_requests(cu: torch.Tensor, num_tokens: int):
    """(request of each token, its position in the request, each request's start)."""
    cu = cu.to(torch.int64)
    starts = torch.cat([cu.new_zeros(1), cu[:-1]])
    tokens = torch.arange(num_tokens, device=cu.device, dtype=torch.int64)
    req = torch.searchsorted(cu, tokens, right=True).clamp_(max=max(cu.numel() - 1, 0))
    return req, tokens - starts[req], starts


def _write_until_rejected(output, spans, cu, tokens, accepted, rows, bonus, max_spec_len):
    """The kernels' common tail: per request (``rows`` only), write ``tokens`` from the
    first draft position through the first rejected one; if none was rejected, the bonus
    token after the last draft. ``spans``: ``_token_requests(cu, num_tokens)``."""
    n = accepted.numel()
    req, pos, starts = spans
    rejected = (~accepted).to(torch.int64)
    before = torch.cat([rejected.new_zeros(1), rejected.cumsum(0)])   # rejections before t
    write = (before[:n] - before[starts][req] == 0) & rows[req]
    flat = output.view(-1)
    width = max_spec_len + 1
    index = req * width + pos
    flat[index] = torch.where(write, tokens.to(output.dtype), flat[index])
    count = cu.to(torch.int64) - starts
    none_rejected = torch.zeros(cu.numel(), dtype=torch.int64, device=cu.device)
    none_rejected.index_add_(0, req, rejected)
    last = torch.arange(cu.numel(), device=cu.device) * width + count
    flat[last] = torch.where((none_rejected == 0) & rows, bonus.view(-1).to(output.dtype),
                             flat[last])


def rejection_greedy_sample(output_token_ids, cu_num_draft_tokens, draft_token_ids,
                            target_argmax, bonus_token_ids, is_greedy, max_spec_len,
                            uniform_probs=None, synthetic_conditional_rates=None,
                            SYNTHETIC_MODE=False) -> None:  # noqa: N803
    """``rejection_sampler.rejection_greedy_sample_kernel`` (greedy requests only): the
    target's argmax at each position through the first draft that differs from it
    (synthetic mode: accepted when ``uniform < rate[pos]`` and the draft is not -1)."""
    cu = cu_num_draft_tokens
    draft, target = draft_token_ids.to(torch.int64), target_argmax.to(torch.int64)
    spans = _token_requests(cu, draft.numel())
    if SYNTHETIC_MODE:
        pos = spans[1]
        accepted = (uniform_probs < synthetic_conditional_rates[pos]) & (draft >= 0)
        tokens = torch.where(accepted, draft, target)
    else:
        accepted, tokens = draft == target, target
    rows = (torch.ones(cu.numel(), dtype=torch.bool, device=cu.device) if is_greedy is None
            else is_greedy.to(torch.bool))
    _write_until_rejected(output_token_ids, spans, cu, tokens, accepted, rows,
                          bonus_token_ids, max_spec_len)


def rejection_random_sample(output_token_ids, cu_num_draft_tokens, draft_token_ids,
                            draft_probs, target_probs, bonus_token_ids, recovered_token_ids,
                            uniform_probs, is_greedy, max_spec_len, vocab_size,
                            synthetic_conditional_rates=None, NO_DRAFT_PROBS=False,  # noqa: N803
                            SYNTHETIC_MODE=False) -> None:  # noqa: N803
    """``rejection_sampler.rejection_random_sample_kernel`` (non-greedy requests only): a
    draft is accepted when ``target_p / draft_p >= uniform`` (draft_p 1 without draft
    probabilities, never when draft_p is 0 or the draft is -1); the first rejected
    position takes the recovered token."""
    cu = cu_num_draft_tokens
    draft = draft_token_ids.to(torch.int64)
    n = draft.numel()
    spans = _token_requests(cu, n)
    pos = spans[1]
    valid = draft >= 0
    if SYNTHETIC_MODE:
        accepted = valid & (uniform_probs < synthetic_conditional_rates[pos])
    else:
        rows_t = torch.arange(n, device=draft.device)
        col = draft.clamp(min=0)
        target_p = target_probs[rows_t, col]
        draft_p = (torch.ones_like(target_p) if NO_DRAFT_PROBS
                   else draft_probs[rows_t, col])
        # divided in the probabilities' dtype, compared with the float64 uniform (Triton's
        # promotion)
        ratio = target_p / torch.where(draft_p > 0, draft_p, torch.ones_like(draft_p))
        accepted = valid & (draft_p > 0) & (ratio.to(torch.float64) >= uniform_probs)
    tokens = torch.where(accepted, draft, recovered_token_ids.to(torch.int64))
    _write_until_rejected(output_token_ids, spans, cu, tokens, accepted,
                          ~is_greedy.to(torch.bool), bonus_token_ids, max_spec_len)


def expand(output, input, cu_num_tokens, replace_from, replace_to,  # noqa: A002
           MAX_NUM_TOKENS=None) -> None:  # noqa: N803
    """``rejection_sampler.expand_kernel``: each request's value (``replace_from`` replaced
    by ``replace_to``) repeated over its tokens."""
    value = torch.where(input == replace_from, torch.full_like(input, replace_to), input)
    req, _, _ = _token_requests(cu_num_tokens, output.numel())
    total = cu_num_tokens[-1:].to(torch.int64)
    inside = torch.arange(output.numel(), device=output.device) < total
    output.copy_(torch.where(inside, value[req].to(output.dtype), output))


def sample_recovered_tokens(output_token_ids, cu_num_draft_tokens, draft_token_ids,
                            draft_probs, target_probs, inv_q, vocab_size, BLOCK_SIZE=None,  # noqa: N803
                            NO_DRAFT_PROBS=False, USE_FP64_GUMBEL=False) -> None:  # noqa: N803
    """``rejection_sampler.sample_recovered_tokens_kernel``: per draft position, the first
    argmax over the vocabulary of ``max(target_p - draft_p, 0) * inv_q[request]``
    (without draft probabilities: ``target_p`` with the draft token's entry zeroed)."""
    n = output_token_ids.numel()
    req, _, _ = _token_requests(cu_num_draft_tokens, n)
    target = target_probs[:n]
    if NO_DRAFT_PROBS:
        draft = draft_token_ids[:n].to(torch.int64)
        drop = (torch.nn.functional.one_hot(draft.clamp(min=0), vocab_size).to(torch.bool)
                & (draft >= 0).unsqueeze(-1))   # a padded draft (-1) drops nothing
        prob = target.masked_fill(drop, 0.0)
    else:
        prob = (target - draft_probs[:n]).clamp(min=0.0)
    score = prob.to(inv_q.dtype) * inv_q[req]
    best = score.argmax(dim=-1).clamp(max=vocab_size - 1)
    output_token_ids.copy_(best.to(output_token_ids.dtype))


_RS = "vllm.v1.sample.rejection_sampler."
SUBSTITUTES = {
    SLOT_MAPPING: compute_slot_mapping,
    _RS + "rejection_greedy_sample_kernel": rejection_greedy_sample,
    _RS + "rejection_random_sample_kernel": rejection_random_sample,
    _RS + "expand_kernel": expand,
    _RS + "sample_recovered_tokens_kernel": sample_recovered_tokens,
    BATCH_MEMCPY: batch_memcpy,
    **DRAFTER_SUBSTITUTES,
}

# Kernels vLLM's CPU platform overrides that the NPU path never launches, each with the
# check that keeps it off. None today: the drafters' input kernels are substituted.
UNREACHED: dict[str, str] = {}


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
