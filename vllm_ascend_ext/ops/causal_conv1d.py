"""``_C_ascend_ext.npu_causal_conv1d_ext``: the Gated-DeltaNet layers' causal depthwise conv.

The plugin's own op, on every SoC: torch_npu 2.13 documents ``npu_fused_causal_conv1d``
for Ascend 950 only, with the kernel width "K固定为3" (fixed at 3: Qwen3-Next and
Qwen3.5 use 4) and ``activation`` / ``bias`` "暂不支持"; A2 / A3 have none.

Semantics. ``x`` ``[T, dim]`` holds ``B`` requests (``query_start_loc`` int32 ``[B+1]``);
``weight`` ``[K, dim]``; ``conv_states`` ``[N, state_len, dim]`` (state_len >= K-1; a
strided view is fine), updated in place; ``cache_indices`` int32 ``[B]`` (a row whose
index is ``pad_slot_id`` reads no state and writes none); ``has_initial_state`` bool
``[B]``. For request ``b`` of length ``L`` in slot ``c``, with ``off = a_b - 1`` where
``a = num_accepted_tokens`` (speculative decoding) and 0 without::

    hist = conv_states[c, off : off+K-1]   (zeros without an initial state)
    seq  = hist ++ x[b's tokens]            (K-1+L rows)
    y[t] = act(sum_j weight[j] * seq[t+j] + bias)            act: silu or none
    conv_states[c, :n] = seq[shift : shift+n],  n = min(state_len, K-1+L-shift)

``shift`` is 1 with ``num_accepted_tokens`` (each verified token's window stays in the
state: next step the window of accepted token ``a`` starts at ``a - 1``, vLLM's scheme,
which needs ``state_len = K-1+num_spec``), ``L`` without (the last K-1 inputs).
fp32 accumulation (float64 for float64 input); ``y`` in ``x``'s dtype.

Dispatch: the compiled kernel when ``_C_ascend_ext`` is loaded (a composite of ATen ops
that never reads tensor data on the host: the CPU kernel, and the NPU kernel in a CANN
build); otherwise the reference below, which reads the index tensors on the host.
"""

from __future__ import annotations

import torch

from vllm_ascend_ext.ops import _ext
from vllm_ascend_ext.ops.counting import npu_op
from vllm_ascend_ext.ops.gdn_recurrent import work_dtype
from vllm_ascend_ext.ops.op_record import NpuOp

OP = "npu_causal_conv1d_ext"


def _check(x, weight, conv_states, query_start_loc, cache_indices, has_initial_state,
           num_accepted_tokens):
    if x.dim() != 2:
        raise ValueError(f"{OP}: x must be [T, dim], got {tuple(x.shape)}")
    if weight.dim() != 2 or weight.shape[1] != x.shape[1]:
        raise ValueError(f"{OP}: weight must be [K, dim={x.shape[1]}], got {tuple(weight.shape)}")
    k = weight.shape[0]
    if conv_states.dim() != 3 or conv_states.shape[2] != x.shape[1] or conv_states.shape[1] < k - 1:
        raise ValueError(f"{OP}: conv_states must be [N, state_len >= {k - 1}, {x.shape[1]}], "
                         f"got {tuple(conv_states.shape)}")
    b = cache_indices.shape[0]
    if tuple(query_start_loc.shape) != (b + 1,) or tuple(has_initial_state.shape) != (b,):
        raise ValueError(f"{OP}: query_start_loc must be [B+1] and has_initial_state [B] for "
                         f"B={b} cache indices")
    if num_accepted_tokens is not None and tuple(num_accepted_tokens.shape) != (b,):
        raise ValueError(f"{OP}: num_accepted_tokens must be [B={b}]")


def causal_conv1d_reference(x, weight, conv_states, query_start_loc, cache_indices,
                            has_initial_state, *, bias=None, num_accepted_tokens=None,
                            silu=True, pad_slot_id=-1):
    _check(x, weight, conv_states, query_start_loc, cache_indices, has_initial_state,
           num_accepted_tokens)
    w = work_dtype(x)
    k, state_len = weight.shape[0], conv_states.shape[1]
    qsl = [int(v) for v in query_start_loc.tolist()]
    slots = [int(v) for v in cache_indices.tolist()]
    init = [bool(v) for v in has_initial_state.tolist()]
    accepted = (None if num_accepted_tokens is None
                else [int(v) for v in num_accepted_tokens.tolist()])
    y = torch.zeros(x.shape, dtype=w)
    for b, c in enumerate(slots):
        s, e = qsl[b], qsl[b + 1]
        n_tok = e - s
        if n_tok == 0:
            continue
        real = c != pad_slot_id
        off = accepted[b] - 1 if accepted is not None else 0
        if real and init[b]:
            if not 0 <= off <= state_len - (k - 1):
                raise ValueError(f"{OP}: request {b}: accepted tokens {off + 1} put the window "
                                 f"past the state ({state_len} rows, kernel {k})")
            hist = conv_states[c, off:off + k - 1].to(w)
        else:
            hist = torch.zeros(k - 1, x.shape[1], dtype=w)
        seq = torch.cat([hist, x[s:e].to(w)])
        for t in range(n_tok):
            y[s + t] = (seq[t:t + k] * weight.to(w)).sum(0)
        if real:
            shift = 1 if accepted is not None else n_tok
            n = min(state_len, k - 1 + n_tok - shift)
            conv_states[c, :n] = seq[shift:shift + n].to(conv_states.dtype)
    if bias is not None:
        y = y + bias.to(w)
    if silu:
        y = torch.nn.functional.silu(y)
    return y.to(x.dtype)


def causal_conv1d_meta(x, weight, conv_states, query_start_loc, cache_indices,
                       has_initial_state, *, bias=None, num_accepted_tokens=None, silu=True,
                       pad_slot_id=-1):
    _check(x, weight, conv_states, query_start_loc, cache_indices, has_initial_state,
           num_accepted_tokens)
    return x.new_empty(x.shape)


def no_npu_kernel(op: str):
    def fail(*args, **kwargs):
        raise RuntimeError(f"{op}: the plugin's compiled op library _C_ascend_ext is not "
                           "loaded, so this op has no NPU kernel; reinstall with README's NPU "
                           "build (CANN present at install time)")
    return fail


@npu_op(f"{_ext.NAMESPACE}.{OP}")
def npu_causal_conv1d_ext(x, weight, conv_states, query_start_loc, cache_indices,
                          has_initial_state, *, bias=None, num_accepted_tokens=None, silu=True,
                          pad_slot_id=-1):
    args = (x, weight, conv_states, query_start_loc, cache_indices, has_initial_state)
    kw = dict(bias=bias, num_accepted_tokens=num_accepted_tokens, silu=silu,
              pad_slot_id=pad_slot_id)
    if _ext.load():
        return getattr(torch.ops, _ext.NAMESPACE).npu_causal_conv1d_ext(*args, **kw)
    impl = CAUSAL_CONV1D_EXT.pick(x.device)
    return impl(*args, **kw)


CAUSAL_CONV1D_EXT = NpuOp(OP, npu=no_npu_kernel(OP), reference=causal_conv1d_reference,
                          meta=causal_conv1d_meta, kernel=OP, torch_npu=False)
