"""``npu_recurrent_gated_delta_rule``: the Gated-DeltaNet recurrence, token by token.

Semantics (torch-npu 2.13.0 documentation, ``_op_plugin_docs.py``; Atlas A2 / A3 only).
With ``B`` requests of lengths ``L_i`` (``actual_seq_lengths``, int32 ``(B,)``) packed into
``T = sum L_i`` tokens:

- ``query``, ``key`` ``(T, Nk, Dk)``, ``value`` ``(T, Nv, Dv)``; ``Nv`` a multiple of
  ``Nk``: value head ``h`` reads query/key head ``h // (Nv // Nk)``;
- ``state`` ``(BlockNum, Nv, Dv, Dk)``, updated in place: "state[ssm_state_indices[i]]
  表示第i个token的状态矩阵" — the state *after* token ``i`` is stored at
  ``ssm_state_indices[i]`` (int32 ``(T,)``);
- a request starts from the state of its ``num_accepted_tokens[b] - 1``-th token slot
  (``num_accepted_tokens`` int32 ``(B,)``, default 1: its first token's slot). That is
  vLLM's speculative scheme: the draft tokens of a verify step write one slot each, and
  the next step resumes from the slot of the last accepted one;
- per token, per value head, with ``alpha = exp(g)`` (``g`` float32 ``(T, Nv)``, default 0)
  and ``beta`` ``(T, Nv)``::

      S  = alpha * S
      S += beta * (v - S k) k^T            (S is Dv x Dk)
      o  = S (scale * q)                    output (T, Nv, Dv)

  ``scale`` is the query scale (1/sqrt(Dk) for Qwen3-Next); ``gk`` is "暂不支持" (None).
  The caller L2-normalises q and k (the documented example does so before the call).

Documented bounds: ``L_i <= 8``, ``Nk, Nv, Dk, Dv <= 256``; dtypes bf16 (``g`` float32).
The reference also takes float32 / float64 (emulation runs fp32 models), works in
float32 (float64 for float64 inputs) across a request's tokens and rounds only what it
stores. It reads the index tensors on the host, as the kernel reads them on the device:
on an NPU it never runs; the plugin's per-step code never reads them.
"""

from __future__ import annotations

import torch

from vllm_ascend_ext.ops._dispatch import torch_npu_module
from vllm_ascend_ext.ops.compiled import emulation_kernel
from vllm_ascend_ext.ops.counting import npu_op
from vllm_ascend_ext.ops.op_record import NpuOp

OP = "npu_recurrent_gated_delta_rule"
KERNEL = "emu_recurrent_gated_delta_rule"
MAX_TOKENS_PER_REQUEST = 8  # "L_i <= 8"
MAX_HEADS_OR_DIM = 256


def work_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def check_gdr_shapes(op: str, query, key, value, state, beta, g, lengths) -> tuple[int, int]:
    """Shapes shared by the GDN operators; returns (T, value heads per key head)."""
    if query.dim() != 3 or key.shape != query.shape:
        raise ValueError(f"{op}: query and key must be (T, Nk, Dk) alike, got "
                         f"{tuple(query.shape)} and {tuple(key.shape)}")
    t, nk, dk = query.shape
    if value.dim() != 3 or value.shape[0] != t:
        raise ValueError(f"{op}: value must be (T={t}, Nv, Dv), got {tuple(value.shape)}")
    nv, dv = value.shape[1], value.shape[2]
    if nv % nk:
        raise ValueError(f"{op}: value heads {nv} must be a multiple of key heads {nk}")
    if state is not None and tuple(state.shape[1:]) != (nv, dv, dk):
        raise ValueError(f"{op}: state must be (*, Nv={nv}, Dv={dv}, Dk={dk}), got "
                         f"{tuple(state.shape)}")
    if beta is None:
        raise ValueError(f"{op}: beta (T, Nv) is required")
    for name, x in (("beta", beta), ("g", g)):
        if x is not None and tuple(x.shape) != (t, nv):
            raise ValueError(f"{op}: {name} must be (T={t}, Nv={nv}), got {tuple(x.shape)}")
    if lengths is None or lengths.dim() != 1:
        raise ValueError(f"{op}: actual_seq_lengths must be a 1-D int32 tensor")
    return t, nv // nk


def _check(query, key, value, state, beta, scale, lengths, indices, accepted, g, gk):
    t, _ = check_gdr_shapes(OP, query, key, value, state, beta, g, lengths)
    if scale is None:
        raise ValueError(f"{OP}: scale is required")
    if indices is None or tuple(indices.shape) != (t,):
        raise ValueError(f"{OP}: ssm_state_indices must be (T={t},) — one state slot per "
                         f"token, got {None if indices is None else tuple(indices.shape)}")
    if accepted is not None and tuple(accepted.shape) != tuple(lengths.shape):
        raise ValueError(f"{OP}: num_accepted_tokens must be (B={lengths.shape[0]},), got "
                         f"{tuple(accepted.shape)}")
    if gk is not None:
        raise ValueError(f"{OP}: gk is not supported (documented: 暂不支持, pass None)")


def _heads(x: torch.Tensor, rep: int, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype).repeat_interleave(rep, dim=1) if rep > 1 else x.to(dtype)


def _host_plan(t, actual_seq_lengths, ssm_state_indices, num_accepted_tokens):
    """(lengths, token slots, accepted counts, request starts) as host lists, checked."""
    lens = [int(n) for n in actual_seq_lengths.tolist()]
    if sum(lens) != t or min(lens, default=0) < 0:
        raise ValueError(f"{OP}: actual_seq_lengths {lens} must be >= 0 and sum to T={t}")
    slots = [int(i) for i in ssm_state_indices.tolist()]
    accepted = ([int(a) for a in num_accepted_tokens.tolist()] if num_accepted_tokens is not None
                else [1] * len(lens))
    starts = [sum(lens[:i]) for i in range(len(lens))]
    for i, n in enumerate(lens):
        if n > 0 and not 1 <= accepted[i] <= n:
            raise ValueError(f"{OP}: request {i} has {n} tokens but num_accepted_tokens "
                             f"{accepted[i]}: the initial state is read from that token's "
                             f"slot, which must lie in the request (1 <= accepted <= L)")
    return lens, slots, accepted, starts


def recurrent_gated_delta_rule_emulated(query, key, value, state, *, beta=None, scale=None,
                                        actual_seq_lengths=None, ssm_state_indices=None,
                                        num_accepted_tokens=None, g=None, gk=None):
    """The emulation's recurrence: the compiled kernel (``_C_ascend_ext.emu_recurrent_
    gated_delta_rule``, fp32 work, ``csrc/emu_gdn.cpp``) after the reference's checks, or
    the reference itself (float64 inputs, no library, ``ASCEND_EXT_PY_REFERENCE=1``)."""
    kernel = emulation_kernel(KERNEL, query.device)
    if (kernel is not None and work_dtype(query) == torch.float32
            and state.dtype != torch.float64 and state.stride(-1) == 1):
        _check(query, key, value, state, beta, scale, actual_seq_lengths, ssm_state_indices,
               num_accepted_tokens, g, gk)
        lens, slots, accepted, starts = _host_plan(query.shape[0], actual_seq_lengths,
                                                   ssm_state_indices, num_accepted_tokens)
        init = [slots[s + a - 1] if n > 0 else 0 for s, a, n in zip(starts, accepted, lens)]
        if _slots_private(slots, starts, lens, init, state.shape[0]):
            return kernel(query, key, value, state, beta, g, float(scale), starts, lens, slots,
                          init)
    return recurrent_gated_delta_rule_reference(
        query, key, value, state, beta=beta, scale=scale,
        actual_seq_lengths=actual_seq_lengths, ssm_state_indices=ssm_state_indices,
        num_accepted_tokens=num_accepted_tokens, g=g, gk=gk)


def _slots_private(slots, starts, lens, init, n_slots) -> bool:
    """Whether every request reads and writes slots no other request touches, all inside
    the state (the builder's guarantee; the kernel runs requests in parallel). Otherwise
    the reference runs, whose order is defined (all initial reads, then writes in order)."""
    owner: dict[int, int] = {}
    for r, (s, n) in enumerate(zip(starts, lens)):
        if n == 0:
            continue
        for slot in slots[s:s + n] + [init[r]]:
            if not 0 <= slot < n_slots or owner.setdefault(slot, r) != r:
                return False
    return True


def recurrent_gated_delta_rule_reference(query, key, value, state, *, beta=None, scale=None,
                                         actual_seq_lengths=None, ssm_state_indices=None,
                                         num_accepted_tokens=None, g=None, gk=None):
    _check(query, key, value, state, beta, scale, actual_seq_lengths, ssm_state_indices,
           num_accepted_tokens, g, gk)
    t, rep = query.shape[0], value.shape[1] // query.shape[1]
    w = work_dtype(query)
    q, k = _heads(query, rep, w) * scale, _heads(key, rep, w)
    v, b = value.to(w), beta.to(w)
    decay = torch.exp(g.to(w)) if g is not None else torch.ones_like(b)
    lens, slots, accepted, starts = _host_plan(t, actual_seq_lengths, ssm_state_indices,
                                               num_accepted_tokens)
    out = torch.zeros(value.shape, dtype=w)
    live = [i for i, n in enumerate(lens) if n > 0]
    if not live:
        return out.to(value.dtype)
    s = state[[slots[starts[i] + accepted[i] - 1] for i in live]].to(w)  # [R, Nv, Dv, Dk]
    for p in range(max(lens)):
        rows = [r for r, i in enumerate(live) if lens[i] > p]
        tok = [starts[live[r]] + p for r in rows]
        cur = s[rows] * decay[tok][:, :, None, None]
        kv = torch.einsum("rhvk,rhk->rhv", cur, k[tok])
        delta = (v[tok] - kv) * b[tok][:, :, None]
        cur = cur + delta[:, :, :, None] * k[tok][:, :, None, :]
        out[tok] = torch.einsum("rhvk,rhk->rhv", cur, q[tok])
        s[rows] = cur
        state[[slots[x] for x in tok]] = cur.to(state.dtype)
    return out.to(value.dtype)


def recurrent_gated_delta_rule_meta(query, key, value, state, *, beta=None, scale=None,
                                    actual_seq_lengths=None, ssm_state_indices=None,
                                    num_accepted_tokens=None, g=None, gk=None):
    _check(query, key, value, state, beta, scale, actual_seq_lengths, ssm_state_indices,
           num_accepted_tokens, g, gk)
    return value.new_empty(value.shape)


def recurrent_gated_delta_rule_npu(query, key, value, state, **kw):
    return torch_npu_module().npu_recurrent_gated_delta_rule(query, key, value, state, **kw)


@npu_op(OP)
def npu_recurrent_gated_delta_rule(query, key, value, state, *, beta=None, scale=None,
                                   actual_seq_lengths=None, ssm_state_indices=None,
                                   num_accepted_tokens=None, g=None, gk=None):
    impl = RECURRENT_GATED_DELTA_RULE.pick(query.device)
    return impl(query, key, value, state, beta=beta, scale=scale,
                actual_seq_lengths=actual_seq_lengths, ssm_state_indices=ssm_state_indices,
                num_accepted_tokens=num_accepted_tokens, g=g, gk=gk)


RECURRENT_GATED_DELTA_RULE = NpuOp(
    OP, npu=recurrent_gated_delta_rule_npu, reference=recurrent_gated_delta_rule_reference,
    meta=recurrent_gated_delta_rule_meta, emulation=recurrent_gated_delta_rule_emulated,
    kernel=KERNEL, rules="GDN_RULES")
