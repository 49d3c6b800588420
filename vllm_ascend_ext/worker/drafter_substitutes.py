"""Torch substitutes for the input-preparation kernels of vLLM's drafters (EAGLE, MTP,
draft models, DFlash), on the NPU.

vLLM 0.32's proposers (``vllm/v1/spec_decode/llm_base_proposer.py``, ``dflash.py``)
launch five Triton kernels from ``vllm/v1/spec_decode/utils.py`` between the target's
verify step and the draft model's forward. Each substitute below has the kernel's own
parameter names (so vLLM's registry forwards the launch by name), computes every program
of the kernel's grid at once with device-generic torch, and reads no device value on the
host: sizes come from the launch's integer arguments and the tensors' shapes. A kernel's
grid size that is not among its arguments is the output's length (``out_slot_mapping``
of the autoregressive step, padded for graphs) or the request count
(``query_end_loc``, ``query_start_loc``). Semantics, read from the kernels, are written
out as loops in ``tests/ut/worker/test_drafter_substitutes.py``.
"""

from __future__ import annotations

import torch

_UTILS = "vllm.v1.spec_decode.utils."
STEP_SLOT_MAPPING = _UTILS + "eagle_step_slot_mapping_metadata_kernel"
PREPARE_INPUTS_PADDED = _UTILS + "eagle_prepare_inputs_padded_kernel"
PREPARE_NEXT_TOKEN_PADDED = _UTILS + "eagle_prepare_next_token_padded_kernel"
COPY_AND_EXPAND_EAGLE = _UTILS + "copy_and_expand_eagle_inputs_kernel"
COPY_AND_EXPAND_DFLASH = _UTILS + "copy_and_expand_dflash_inputs_kernel"


def _i64(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.int64)


def eagle_step_slot_mapping_metadata(positions_ptr, block_table_ptr, block_table_stride,
                                     seq_lens_ptr, out_clamped_positions_ptr,
                                     out_slot_mapping_ptr, block_size, max_model_len,
                                     n_blocks_per_req, PAD_ID, batch_size) -> None:  # noqa: N803
    """One autoregressive draft step: ``position + 1`` (0 past ``max_model_len``), its
    slot from the block table (``PAD_ID`` past the limit), ``seq_lens + 1`` (1 past the
    limit, at most ``max_model_len``); graph padding rows of ``out_slot_mapping`` (from
    ``batch_size`` on) get ``PAD_ID``. ``positions`` may alias ``out_clamped_positions``:
    everything is read before anything is written."""
    b = int(batch_size)
    device = out_slot_mapping_ptr.device
    position = _i64(positions_ptr[:b]) + 1
    exceeds = position >= max_model_len
    clamped = torch.where(exceeds, torch.zeros_like(position), position)
    block_number = (clamped // block_size).clamp(max=n_blocks_per_req - 1)
    rows = torch.arange(b, device=device)
    block_id = _i64(block_table_ptr[rows, block_number])
    slot = block_id * block_size + clamped % block_size
    slot = torch.where(exceeds, torch.full_like(slot, PAD_ID), slot)
    seq = _i64(seq_lens_ptr[:b])
    new_seq = torch.where(exceeds, torch.ones_like(seq), seq + 1).clamp(max=max_model_len)
    out_clamped_positions_ptr[:b] = clamped.to(out_clamped_positions_ptr.dtype)
    out_slot_mapping_ptr[:b] = slot.to(out_slot_mapping_ptr.dtype)
    out_slot_mapping_ptr[b:] = PAD_ID
    seq_lens_ptr[:b] = new_seq.to(seq_lens_ptr.dtype)


def eagle_prepare_inputs_padded(cu_num_draft_tokens_ptr, valid_sampled_tokens_count_ptr,
                                query_start_loc_gpu_ptr, token_indices_to_sample_ptr,
                                num_rejected_tokens_gpu_ptr, num_reqs) -> None:
    """Per request: rejected = drafts + 1 - valid (0 without drafts); the token to sample
    from is the request's last query token minus the rejected ones. ``cu_num_draft_tokens``
    is the inclusive running sum."""
    n = int(num_reqs)
    cu = _i64(cu_num_draft_tokens_ptr[:n])
    drafts = cu - torch.cat([cu.new_zeros(1), cu[:-1]])
    valid = _i64(valid_sampled_tokens_count_ptr[:n])
    rejected = torch.where(drafts > 0, drafts + 1 - valid, torch.zeros_like(drafts))
    last = _i64(query_start_loc_gpu_ptr[1:n + 1]) - 1
    token_indices_to_sample_ptr[:n] = (last - rejected).to(token_indices_to_sample_ptr.dtype)
    num_rejected_tokens_gpu_ptr[:n] = rejected.to(num_rejected_tokens_gpu_ptr.dtype)


def eagle_prepare_next_token_padded(sampled_token_ids_ptr, discard_request_mask_ptr,
                                    backup_next_token_ids_ptr, next_token_ids_ptr,
                                    valid_sampled_tokens_count_ptr, vocab_size,
                                    num_sampled_tokens_per_req, num_reqs,
                                    stride_sampled_token_ids,
                                    BLOCK_SIZE_TOKENS=None) -> None:  # noqa: N803
    """Per request: the count of valid sampled tokens (not -1, below ``vocab_size``) and
    the last valid one as the next token; the backup token when none is valid or the
    request is discarded (whose count is 0). ``stride_sampled_token_ids`` is the tensor's
    own row stride, which indexing the tensor honours."""
    n, width = int(num_reqs), int(num_sampled_tokens_per_req)
    tokens = _i64(sampled_token_ids_ptr[:n, :width])
    valid = (tokens != -1) & (tokens < vocab_size)
    count = valid.sum(dim=1)
    columns = torch.arange(width, device=tokens.device).expand(n, width)
    last_index = torch.where(valid, columns, torch.full_like(columns, -1)).amax(dim=1)
    last_token = tokens.gather(1, last_index.clamp(min=0).unsqueeze(1)).squeeze(1)
    discard = discard_request_mask_ptr[:n].to(torch.bool)
    backup = _i64(backup_next_token_ids_ptr[:n])
    use_backup = discard | (count == 0)
    next_token_ids_ptr[:n] = torch.where(use_backup, backup, last_token).to(
        next_token_ids_ptr.dtype)
    valid_sampled_tokens_count_ptr[:n] = torch.where(discard, torch.zeros_like(count),
                                                     count).to(
        valid_sampled_tokens_count_ptr.dtype)


def copy_and_expand_eagle_inputs(target_token_ids_ptr, target_positions_ptr,
                                 next_token_ids_ptr, out_input_ids_ptr, out_positions_ptr,
                                 out_is_rejected_token_mask_ptr,
                                 out_is_masked_token_mask_ptr, out_new_token_indices_ptr,
                                 out_hidden_state_mapping_ptr, query_start_loc_ptr,
                                 query_end_loc_ptr, padding_token_id,
                                 parallel_drafting_token_id, total_input_tokens,
                                 num_padding_slots_per_request, shift_input_ids,
                                 BLOCK_SIZE_TOKENS=None) -> None:  # noqa: N803
    """The drafting buffers of parallel drafting / draft models. Request ``r`` owns
    output slots ``[start_r, start_r + total_r)`` with ``start_r = qs_r + r * (P - s)``
    (``P`` padding slots per request, ``s`` 1 when input ids shift): its valid tokens
    (shifted by ``s``), the bonus token, ``P - 1`` parallel-drafting tokens, then its
    rejected tokens (padding id, position 0, flagged). The new tokens' output indices go
    to ``out_new_token_indices[r * P + i]``; with the shift, each input token's output
    index to ``out_hidden_state_mapping``. Requests' output spans are consecutive, so one
    output slot's request is a search over their ends."""
    device = out_input_ids_ptr.device
    b = query_end_loc_ptr.shape[0]
    pad_slots, shift = int(num_padding_slots_per_request), 1 if shift_input_ids else 0
    qs = _i64(query_start_loc_ptr[:b])
    next_qs = _i64(query_start_loc_ptr[1:b + 1])
    qe = _i64(query_end_loc_ptr[:b])
    num_valid = qe - qs + 1 - shift
    total = num_valid + pad_slots + (next_qs - qe - 1)
    start = qs + torch.arange(b, device=device) * (pad_slots - shift)
    end = start + total
    upper = int(total_input_tokens) + b * (pad_slots - shift)   # host bound on the outputs
    if upper <= 0 or b == 0:
        return
    out = torch.arange(upper, device=device)
    req = torch.searchsorted(end, out, right=True).clamp(max=b - 1)
    inside = (out >= start[req]) & (out < end[req])
    j = out - start[req]
    nv = num_valid[req]
    valid_region = j < nv
    bonus_region = j == nv
    draft_region = (j > nv) & (j < nv + pad_slots)
    rejected_region = j >= nv + pad_slots
    source = (qs[req] + shift + j).clamp(max=int(total_input_tokens) - 1)
    tokens = torch.where(valid_region, _i64(target_token_ids_ptr[source]),
                         torch.zeros_like(out))
    tokens = torch.where(bonus_region, _i64(next_token_ids_ptr[:b])[req], tokens)
    tokens = torch.where(draft_region, torch.full_like(tokens, parallel_drafting_token_id),
                         tokens)
    tokens = torch.where(rejected_region, torch.full_like(tokens, padding_token_id), tokens)
    start_pos = _i64(target_positions_ptr[qs.clamp(max=int(total_input_tokens) - 1)])
    positions = torch.where(rejected_region, torch.zeros_like(out), start_pos[req] + j)
    index = torch.where(inside, out, torch.zeros_like(out))
    keep = ~inside

    def put(buffer, values):
        view = buffer[:upper]
        n = view.shape[0]
        view.copy_(torch.where(keep[:n], view, values[:n].to(buffer.dtype)))

    put(out_input_ids_ptr, tokens)
    put(out_positions_ptr, positions)
    put(out_is_rejected_token_mask_ptr, rejected_region & inside)
    put(out_is_masked_token_mask_ptr, draft_region & inside)
    new_region = inside & (j >= nv) & (j < nv + pad_slots)
    new_slot = torch.where(new_region, req * pad_slots + (j - nv),
                           torch.full_like(out, b * pad_slots))   # one past: dropped
    sink = torch.cat([out_new_token_indices_ptr[:b * pad_slots].to(torch.int64),
                      out.new_zeros(1)])
    sink.scatter_(0, new_slot, index)
    out_new_token_indices_ptr[:b * pad_slots] = sink[:-1].to(out_new_token_indices_ptr.dtype)
    if shift:
        n_in = int(total_input_tokens)
        tok = torch.arange(n_in, device=device)
        tok_req = torch.searchsorted(next_qs, tok, right=True).clamp(max=b - 1)
        mapped = start[tok_req] + (tok - qs[tok_req])
        real = tok < next_qs[-1]
        view = out_hidden_state_mapping_ptr[:n_in]
        view.copy_(torch.where(real, mapped.to(view.dtype), view))


def copy_and_expand_dflash_inputs(next_token_ids_ptr, target_positions_ptr,
                                  out_input_ids_ptr, out_context_positions_ptr,
                                  out_query_positions_ptr, out_context_slot_mapping_ptr,
                                  out_query_slot_mapping_ptr, out_token_indices_ptr,
                                  block_table_ptr, block_table_stride, query_start_loc_ptr,
                                  num_rejected_tokens_ptr, parallel_drafting_token_id,
                                  block_size, num_query_per_req, num_speculative_tokens,
                                  total_input_tokens, BLOCK_SIZE=None,  # noqa: N803
                                  HAS_NUM_REJECTED=False) -> None:  # noqa: N803
    """DFlash's first pass. Context tokens keep their positions and get their slots;
    request ``r``'s ``num_query_per_req`` query tokens sit at positions after its last
    accepted context token (rejected ones excluded), at ``r * num_query_per_req + i``:
    the bonus token then parallel-drafting tokens, whose indices (the bonus excluded) are
    the tokens to sample. Block numbers are clamped to the table's width."""
    device = out_input_ids_ptr.device
    b = query_start_loc_ptr.shape[0] - 1
    q, n_ctx = int(num_query_per_req), int(total_input_tokens)
    width = int(block_table_stride)
    ends = _i64(query_start_loc_ptr[1:b + 1])
    table = block_table_ptr

    def slots(rows, positions):
        block = (positions // block_size).clamp(max=width - 1)
        return _i64(table[rows, block]) * block_size + positions % block_size

    if n_ctx > 0 and b > 0:
        tok = torch.arange(n_ctx, device=device)
        tok_req = torch.searchsorted(ends, tok, right=True).clamp(max=b - 1)
        real = tok < ends[-1]
        ctx_pos = _i64(target_positions_ptr[:n_ctx])
        for buffer, values in ((out_context_positions_ptr, ctx_pos),
                               (out_context_slot_mapping_ptr, slots(tok_req, ctx_pos))):
            view = buffer[:n_ctx]
            view.copy_(torch.where(real, values.to(view.dtype), view))
    if b == 0 or q == 0:
        return
    valid_end = ends - (_i64(num_rejected_tokens_ptr[:b]) if HAS_NUM_REJECTED else 0)
    last_pos = _i64(target_positions_ptr[valid_end - 1])
    rows = torch.arange(b, device=device).repeat_interleave(q)
    offset = torch.arange(q, device=device).repeat(b)
    query_pos = last_pos[rows] + 1 + offset
    out_query_positions_ptr[:b * q] = query_pos.to(out_query_positions_ptr.dtype)
    out_query_slot_mapping_ptr[:b * q] = slots(rows, query_pos).to(
        out_query_slot_mapping_ptr.dtype)
    ids = torch.where(offset == 0, _i64(next_token_ids_ptr[:b])[rows],
                      torch.full_like(offset, parallel_drafting_token_id))
    out_input_ids_ptr[:b * q] = ids.to(out_input_ids_ptr.dtype)
    k = int(num_speculative_tokens)
    if q > 1 and k > 0:
        query_out = (rows * q + offset).view(b, q)[:, 1:]
        target = (torch.arange(b, device=device).unsqueeze(1) * k
                  + torch.arange(q - 1, device=device)).reshape(-1)
        out_token_indices_ptr[target] = query_out.reshape(-1).to(out_token_indices_ptr.dtype)


SUBSTITUTES = {
    STEP_SLOT_MAPPING: eagle_step_slot_mapping_metadata,
    PREPARE_INPUTS_PADDED: eagle_prepare_inputs_padded,
    PREPARE_NEXT_TOKEN_PADDED: eagle_prepare_next_token_padded,
    COPY_AND_EXPAND_EAGLE: copy_and_expand_eagle_inputs,
    COPY_AND_EXPAND_DFLASH: copy_and_expand_dflash_inputs,
}
