"""``npu_chunk_gated_delta_rule``: the Gated-DeltaNet recurrence over whole prompts, chunked.

Semantics (torch-npu 2.13.0 documentation; Atlas A2 / A3 only): the same recurrence as
``npu_recurrent_gated_delta_rule`` (see ``gdn_recurrent``) over ``B`` requests of lengths
``actual_seq_lengths`` packed into ``T`` tokens, but each request starts from
``initial_state[b]`` (``(B, Nv, Dv, Dk)``, one per request, not a slot table) and the op
returns ``(out (T, Nv, Dv), final_state (B, Nv, Dv, Dk))``; nothing is updated in place
(the schema marks no argument mutable). The caller scatters ``final_state`` into its
state slots. Documented bounds: ``Nk, Nv <= 64``, ``Dk = Dv = 128``, ``Nv`` a multiple of
``Nk``; bf16 (``g`` float32). The documentation also lists "L_i <= 8", copied from the
recurrent op, which its own example (``seqlen = 100``) contradicts; not enforced.

The reference computes the chunked form (chunks of ``CHUNK`` tokens, sequential across
chunks, parallel within one). Writing ``G_t`` for the running sum of ``g`` inside a chunk,
``S0`` for the state entering it and ``u_t`` for token t's state correction::

    S_t = e^{G_t} S0 + sum_{j<=t} e^{G_t - G_j} u_j k_j^T
    u_t = beta_t (v_t - e^{G_t} S0 k_t - sum_{j<t} e^{G_t - G_j} (k_t . k_j) u_j)

so ``(I + A) U = beta (V - e^G K S0^T)`` with ``A`` strictly lower triangular, solved by
a unit-triangular solve; then ``O = e^G Q S0^T + (decay * Q K^T)_{j<=t} U`` and the chunk's
final state ``e^{G_C} S0 + U^T e^{G_C - G} K``. It equals the token-by-token recurrence
(tests/ut/ops/test_gdn_ops.py, float64). It reads ``actual_seq_lengths`` on the host, as the
kernel does on the device; on an NPU it never runs.
"""

from __future__ import annotations

import torch

from vllm_ascend_ext.ops._dispatch import torch_npu_module
from vllm_ascend_ext.ops.counting import npu_op
from vllm_ascend_ext.ops.gdn_recurrent import check_gdr_shapes, work_dtype
from vllm_ascend_ext.ops.op_record import NpuOp

OP = "npu_chunk_gated_delta_rule"
CHUNK = 64


def _check(query, key, value, beta, initial_state, lengths, scale, g):
    check_gdr_shapes(OP, query, key, value, initial_state, beta, g, lengths)
    if scale is None:
        raise ValueError(f"{OP}: scale is required")
    if initial_state is not None and initial_state.shape[0] != lengths.shape[0]:
        raise ValueError(f"{OP}: initial_state must hold one state per request "
                         f"(B={lengths.shape[0]}), got {tuple(initial_state.shape)}")


def chunk_one(q, k, v, g, b, s0, chunk: int = CHUNK):
    """One request: q, k [L, H, Dk] (heads expanded, scaled), v [L, H, Dv], g, b [L, H],
    s0 [H, Dv, Dk] (work dtype). Returns (out [L, H, Dv], final state [H, Dv, Dk])."""
    n = q.shape[0]
    outs = []
    s = s0
    for c0 in range(0, n, chunk):
        qc, kc, vc = (x[c0:c0 + chunk].transpose(0, 1) for x in (q, k, v))  # [H, C, D]
        gc, bc = g[c0:c0 + chunk].t(), b[c0:c0 + chunk].t()                   # [H, C]
        cum = gc.cumsum(-1)
        size = cum.shape[-1]
        lower = torch.ones(size, size, dtype=torch.bool).tril()
        decay = torch.exp((cum[:, :, None] - cum[:, None, :]).masked_fill(~lower, float("-inf")))
        a = (bc[:, :, None] * decay * (kc @ kc.transpose(-1, -2))).tril(-1)
        rhs = bc[:, :, None] * (vc - torch.exp(cum)[:, :, None] * (kc @ s.transpose(-1, -2)))
        eye = torch.eye(size, dtype=a.dtype)
        u = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True)
        o = torch.exp(cum)[:, :, None] * (qc @ s.transpose(-1, -2)) + (decay * (qc @ kc.transpose(-1, -2))) @ u
        outs.append(o.transpose(0, 1))
        tail = torch.exp(cum[:, -1:] - cum)                                    # [H, C]
        s = torch.exp(cum[:, -1])[:, None, None] * s + u.transpose(-1, -2) @ (tail[:, :, None] * kc)
    return torch.cat(outs) if outs else v.new_zeros(v.shape), s


def chunk_gated_delta_rule_reference(query, key, value, *, beta=None, initial_state=None,
                                     actual_seq_lengths=None, scale=None, g=None):
    _check(query, key, value, beta, initial_state, actual_seq_lengths, scale, g)
    t, nk, dk = query.shape
    nv, dv = value.shape[1:]
    rep, w = nv // nk, work_dtype(query)
    q = query.to(w).repeat_interleave(rep, dim=1) * scale
    k = key.to(w).repeat_interleave(rep, dim=1)
    v, b = value.to(w), beta.to(w)
    gg = g.to(w) if g is not None else torch.zeros_like(b)
    lens = [int(n) for n in actual_seq_lengths.tolist()]
    if sum(lens) != t or min(lens, default=0) < 0:
        raise ValueError(f"{OP}: actual_seq_lengths {lens} must be >= 0 and sum to T={t}")
    state_dtype = initial_state.dtype if initial_state is not None else value.dtype
    out = torch.zeros(value.shape, dtype=w)
    finals = []
    start = 0
    for i, n in enumerate(lens):
        s0 = (initial_state[i].to(w) if initial_state is not None
              else torch.zeros(nv, dv, dk, dtype=w))
        sl = slice(start, start + n)
        o, s = chunk_one(q[sl], k[sl], v[sl], gg[sl], b[sl], s0)
        out[sl] = o
        finals.append(s)
        start += n
    final = (torch.stack(finals) if finals else torch.zeros(0, nv, dv, dk, dtype=w))
    return out.to(value.dtype), final.to(state_dtype)


def chunk_gated_delta_rule_meta(query, key, value, *, beta=None, initial_state=None,
                                actual_seq_lengths=None, scale=None, g=None):
    _check(query, key, value, beta, initial_state, actual_seq_lengths, scale, g)
    nv, dv, dk = value.shape[1], value.shape[2], query.shape[2]
    state_dtype = initial_state.dtype if initial_state is not None else value.dtype
    return (value.new_empty(value.shape),
            value.new_empty((actual_seq_lengths.shape[0], nv, dv, dk), dtype=state_dtype))


def chunk_gated_delta_rule_npu(query, key, value, **kw):
    return torch_npu_module().npu_chunk_gated_delta_rule(query, key, value, **kw)


@npu_op(OP)
def npu_chunk_gated_delta_rule(query, key, value, *, beta=None, initial_state=None,
                               actual_seq_lengths=None, scale=None, g=None):
    impl = CHUNK_GATED_DELTA_RULE.pick(query.device)
    return impl(query, key, value, beta=beta, initial_state=initial_state,
                actual_seq_lengths=actual_seq_lengths, scale=scale, g=g)


CHUNK_GATED_DELTA_RULE = NpuOp(OP, npu=chunk_gated_delta_rule_npu,
                               reference=chunk_gated_delta_rule_reference,
                               meta=chunk_gated_delta_rule_meta, rules="GDN_RULES")
