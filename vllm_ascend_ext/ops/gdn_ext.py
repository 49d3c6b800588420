"""``_C_ascend_ext.npu_recurrent_gated_delta_rule_ext``: the recurrence where torch_npu has none.

torch_npu 2.13 documents ``npu_recurrent_gated_delta_rule`` and
``npu_chunk_gated_delta_rule`` for Atlas A2 / A3 only. On other SoCs (Ascend 950) the
plugin's own op serves decode, speculative verify and prefill alike: the semantics of
``npu_recurrent_gated_delta_rule`` (``gdn_recurrent``: per-token ``ssm_state_indices``,
start from the slot of token ``num_accepted_tokens - 1``), without its 8-token bound, plus

- ``has_initial_state`` bool ``[B]`` (optional): rows without one start from zeros (a
  prefill's first chunk), so prefills need no state reset beforehand;
- ``max_seq_len``: the caller's bound on the longest request (a host value the builder
  has); the compiled kernel iterates that many positions, vectorised over requests.

Preconditions (the builder's; the reference checks them): every request has >= 1 token,
no request longer than ``max_seq_len``, no two requests share a state slot.

Dispatch: the compiled kernel when ``_C_ascend_ext`` is loaded (ATen composite, no host
read of tensor data: CPU kernel, and NPU kernel in a CANN build); otherwise the reference.
"""

from __future__ import annotations

import torch

from vllm_ascend_ext.ops import _ext
from vllm_ascend_ext.ops.causal_conv1d import no_npu_kernel
from vllm_ascend_ext.ops.counting import npu_op
from vllm_ascend_ext.ops.gdn_recurrent import (
    recurrent_gated_delta_rule_meta,
    recurrent_gated_delta_rule_reference,
)
from vllm_ascend_ext.ops.op_record import NpuOp

OP = "npu_recurrent_gated_delta_rule_ext"


def recurrent_gdr_ext_reference(query, key, value, state, *, beta, scale, actual_seq_lengths,
                                ssm_state_indices, num_accepted_tokens=None, g=None,
                                has_initial_state=None, max_seq_len=8):
    lens = [int(n) for n in actual_seq_lengths.tolist()]
    if lens and (min(lens) < 1 or max(lens) > max_seq_len):
        raise ValueError(f"{OP}: request lengths {lens} must lie in [1, max_seq_len="
                         f"{max_seq_len}]")
    slots = ssm_state_indices.tolist()
    if has_initial_state is not None and not bool(has_initial_state.all()):
        # Rows without a state start from zeros: zero their first slot in a copy of the
        # state read, by running on a patched copy of the slots they read.
        accepted = (num_accepted_tokens.tolist() if num_accepted_tokens is not None
                    else [1] * len(lens))
        starts = [sum(lens[:i]) for i in range(len(lens))]
        for i, init in enumerate(has_initial_state.tolist()):
            if not init:
                state[slots[starts[i] + accepted[i] - 1]] = 0
    return recurrent_gated_delta_rule_reference(
        query, key, value, state, beta=beta, scale=scale, actual_seq_lengths=actual_seq_lengths,
        ssm_state_indices=ssm_state_indices, num_accepted_tokens=num_accepted_tokens, g=g)


def recurrent_gdr_ext_meta(query, key, value, state, *, beta, scale, actual_seq_lengths,
                           ssm_state_indices, num_accepted_tokens=None, g=None,
                           has_initial_state=None, max_seq_len=8):
    return recurrent_gated_delta_rule_meta(
        query, key, value, state, beta=beta, scale=scale, actual_seq_lengths=actual_seq_lengths,
        ssm_state_indices=ssm_state_indices, num_accepted_tokens=num_accepted_tokens, g=g)


@npu_op(f"{_ext.NAMESPACE}.{OP}")
def npu_recurrent_gated_delta_rule_ext(query, key, value, state, *, beta, scale,
                                       actual_seq_lengths, ssm_state_indices,
                                       num_accepted_tokens=None, g=None,
                                       has_initial_state=None, max_seq_len=8):
    kw = dict(beta=beta, scale=scale, actual_seq_lengths=actual_seq_lengths,
              ssm_state_indices=ssm_state_indices, num_accepted_tokens=num_accepted_tokens,
              g=g, has_initial_state=has_initial_state, max_seq_len=max_seq_len)
    if _ext.load():
        return getattr(torch.ops, _ext.NAMESPACE).npu_recurrent_gated_delta_rule_ext(
            query, key, value, state, **kw)
    impl = RECURRENT_GDR_EXT.pick(query.device)
    return impl(query, key, value, state, **kw)


RECURRENT_GDR_EXT = NpuOp(OP, npu=no_npu_kernel(OP), reference=recurrent_gdr_ext_reference,
                          meta=recurrent_gdr_ext_meta, kernel=OP, torch_npu=False)
