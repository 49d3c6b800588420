"""Gated-DeltaNet operators against explicit per-token, per-head loops in float64.

Every expected value is built from the documented semantics (the operator modules'
docstrings) by loops written here, one token / one head / one channel at a time, never
from the code under test:

- ``npu_recurrent_gated_delta_rule`` (torch_npu op, Python reference in emulation):
  per-token state slots, the start slot of token ``num_accepted - 1``, GQA-style heads;
- ``npu_chunk_gated_delta_rule`` (chunked form): equals the recurrence, across chunks;
- the speculative property the plugin relies on (verify slots hold what plain decodes of
  the accepted prefix leave);
- the plugin's own ops ``_C_ascend_ext.npu_recurrent_gated_delta_rule_ext`` and
  ``npu_causal_conv1d_ext``: compiled kernel == Python reference == explicit loops;
- the gate / l2norm composites; the public wrappers on ``meta`` tensors.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_ascend_ext.ops import _ext
from vllm_ascend_ext.ops.causal_conv1d import causal_conv1d_reference, npu_causal_conv1d_ext
from vllm_ascend_ext.ops.gdn_chunk import (
    chunk_gated_delta_rule_reference,
    npu_chunk_gated_delta_rule,
)
from vllm_ascend_ext.ops.gdn_ext import (
    npu_recurrent_gated_delta_rule_ext,
    recurrent_gdr_ext_reference,
)
from vllm_ascend_ext.ops.gdn_gating import gdn_gates, l2norm
from vllm_ascend_ext.ops.gdn_recurrent import (
    npu_recurrent_gated_delta_rule,
    recurrent_gated_delta_rule_reference,
)

SETTINGS = settings(max_examples=30, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
COMPILED = _ext.load()
needs_compiled = pytest.mark.skipif(
    not COMPILED, reason="vllm_ascend_ext._C_ascend_ext is not loaded (not built here): "
                         "no compiled kernel to compare with its reference")
I32 = torch.int32
F64_TOL = dict(rtol=1e-10, atol=1e-10)
F32_TOL = dict(rtol=2e-5, atol=2e-5)


def _tol(dtype):
    return F64_TOL if dtype == torch.float64 else F32_TOL


def _i32(values):
    return torch.tensor(list(values), dtype=I32)


def _starts(lens):
    out, acc = [], 0
    for n in lens:
        out.append(acc)
        acc += n
    return out


# ------------------------------------------------------------------ independent math
def explicit_recurrence(q, k, v, g, beta, scale, init_states, lens):
    """The gated delta rule token by token, head by head, in float64.

    q, k [T, Nk, Dk]; v [T, Nv, Dv]; g [T, Nv] (None: decay 1); beta [T, Nv];
    init_states: one [Nv, Dv, Dk] per request. Value head h reads key head h // (Nv // Nk).
    Returns (out [T, Nv, Dv], after: the [Nv, Dv, Dk] state after each token, finals:
    each request's last state).
    """
    t, nk, _ = q.shape
    nv = v.shape[1]
    rep = nv // nk
    out = torch.zeros(t, nv, v.shape[2], dtype=torch.float64)
    after, finals = [None] * t, []
    for b, (start, n) in enumerate(zip(_starts(lens), lens)):
        heads = [init_states[b][h].double().clone() for h in range(nv)]
        for i in range(start, start + n):
            for h in range(nv):
                kh = k[i, h // rep].double()
                qh = q[i, h // rep].double() * scale
                alpha = 1.0 if g is None else math.exp(float(g[i, h]))
                s = heads[h] * alpha                                  # S = exp(g) S
                err = v[i, h].double() - s @ kh                       # v - S k
                s = s + float(beta[i, h]) * torch.outer(err, kh)      # S += beta err k^T
                out[i, h] = s @ qh                                    # o = S (scale q)
                heads[h] = s
            after[i] = torch.stack(heads)
        finals.append(torch.stack(heads))
    return out, after, finals


def gdn_inputs(gen, t, nk, nv, dk, dv, dtype, with_g=True):
    """L2-normalised q / k (as the caller does), beta in (0, 1), g < 0 (a decay)."""
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    g = -F.softplus(r(t, nv)) if with_g else None
    g_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    return dict(q=F.normalize(r(t, nk, dk), dim=-1).to(dtype),
                k=F.normalize(r(t, nk, dk), dim=-1).to(dtype),
                v=r(t, nv, dv).to(dtype),
                g=None if g is None else g.to(g_dtype),
                beta=torch.sigmoid(r(t, nv)).to(dtype))


def _recurrent(fn, inp, state, lens, slots, accepted=None, **extra):
    return fn(inp["q"], inp["k"], inp["v"], state, beta=inp["beta"],
              scale=inp["q"].shape[-1] ** -0.5, actual_seq_lengths=_i32(lens),
              ssm_state_indices=_i32(slots),
              num_accepted_tokens=None if accepted is None else _i32(accepted),
              g=inp["g"], **extra)


def _compiled_ext(*args, **kw):
    return torch.ops._C_ascend_ext.npu_recurrent_gated_delta_rule_ext(*args, **kw)


def _check_slots(state, before, slots, after, tol):
    """Token i's slot holds the state after token i; every other slot is untouched."""
    for i, slot in enumerate(slots):
        torch.testing.assert_close(state[slot].double(), after[i], **tol)
    for slot in range(state.shape[0]):
        if slot not in slots:
            assert torch.equal(state[slot], before[slot]), f"slot {slot} was written"


# ------------------------------------------------------- 1. the torch_npu recurrent op
def _draw_case(seed, lens, nk, rep, dk, dv, dtype, with_g, use_accepted, data):
    """Inputs, distinct slots (3 spare) and accepted counts for one hypothesis example."""
    gen = torch.Generator().manual_seed(seed)
    t, nv = sum(lens), nk * rep
    inp = gdn_inputs(gen, t, nk, nv, dk, dv, dtype, with_g)
    n_slots = t + 3
    slots = torch.randperm(n_slots, generator=gen)[:t].tolist()
    accepted = [data.draw(st.integers(1, n)) for n in lens] if use_accepted else None
    return gen, t, nv, inp, n_slots, slots, accepted


@SETTINGS
@given(lens=st.lists(st.integers(1, 8), min_size=1, max_size=4), nk=st.sampled_from([1, 2]),
       rep=st.sampled_from([1, 2]), dk=st.integers(4, 8), dv=st.integers(4, 8),
       dtype=st.sampled_from([torch.float64, torch.float32]), with_g=st.booleans(),
       use_accepted=st.booleans(), seed=st.integers(0, 2**16), data=st.data())
def test_recurrent_op_matches_explicit_loop(lens, nk, rep, dk, dv, dtype, with_g, use_accepted,
                                            seed, data):
    gen, t, nv, inp, n_slots, slots, accepted = _draw_case(seed, lens, nk, rep, dk, dv, dtype,
                                                           with_g, use_accepted, data)
    state = torch.randn(n_slots, nv, dv, dk, generator=gen, dtype=torch.float64).to(dtype)
    before = state.clone()
    init = [before[slots[s + (accepted[b] if accepted else 1) - 1]]
            for b, s in enumerate(_starts(lens))]
    out = _recurrent(npu_recurrent_gated_delta_rule, inp, state, lens, slots, accepted)
    want, after, _ = explicit_recurrence(inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"],
                                         dk ** -0.5, init, lens)
    assert out.dtype == dtype and out.shape == (t, nv, dv)
    torch.testing.assert_close(out.double(), want, **_tol(dtype))
    _check_slots(state, before, slots, after, _tol(dtype))


def test_recurrent_g_none_is_decay_one():
    gen = torch.Generator().manual_seed(3)
    inp = gdn_inputs(gen, 5, 1, 2, 4, 4, torch.float64, with_g=True)
    s1 = torch.randn(5, 2, 4, 4, generator=gen, dtype=torch.float64)
    s2 = s1.clone()
    o1 = _recurrent(npu_recurrent_gated_delta_rule, {**inp, "g": None}, s1, [2, 3], range(5))
    o2 = _recurrent(npu_recurrent_gated_delta_rule, {**inp, "g": torch.zeros(5, 2, dtype=torch.float64)},
                    s2, [2, 3], range(5))
    torch.testing.assert_close(o1, o2, **F64_TOL)
    torch.testing.assert_close(s1, s2, **F64_TOL)


@pytest.mark.parametrize("lens,accepted", [([1, 3], [1, 4]), ([1, 3], [0, 1]),
                                           ([1, 3], [2, 1])])
def test_recurrent_initial_slot_must_lie_in_the_request(lens, accepted):
    gen = torch.Generator().manual_seed(4)
    inp = gdn_inputs(gen, 4, 1, 1, 4, 4, torch.float32)
    with pytest.raises(ValueError, match="num_accepted_tokens"):
        _recurrent(npu_recurrent_gated_delta_rule, inp, torch.zeros(6, 1, 4, 4), lens,
                   range(4), accepted)


def test_recurrent_gk_is_refused():
    gen = torch.Generator().manual_seed(5)
    inp = gdn_inputs(gen, 2, 1, 1, 4, 4, torch.float32)
    with pytest.raises(ValueError, match="gk"):
        _recurrent(npu_recurrent_gated_delta_rule, inp, torch.zeros(2, 1, 4, 4), [2], [0, 1],
                   gk=torch.zeros(2, 1, 4))


# -------------------------------------------------------------------- 2. the chunk op
def _chunk(inp, lens, init, fn=npu_chunk_gated_delta_rule):
    return fn(inp["q"], inp["k"], inp["v"], beta=inp["beta"], initial_state=init,
              actual_seq_lengths=_i32(lens), scale=inp["q"].shape[-1] ** -0.5, g=inp["g"])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lens=st.lists(st.sampled_from([0, 1, 5, 63, 64, 65, 100, 129, 150]), min_size=1,
                     max_size=3),
       nk=st.sampled_from([1, 2]), rep=st.sampled_from([1, 2]), dk=st.integers(4, 6),
       dv=st.integers(4, 6), with_init=st.booleans(), with_g=st.booleans(),
       seed=st.integers(0, 2**16))
def test_chunk_op_matches_explicit_loop(lens, nk, rep, dk, dv, with_init, with_g, seed):
    gen = torch.Generator().manual_seed(seed)
    t, nv = sum(lens), nk * rep
    inp = gdn_inputs(gen, t, nk, nv, dk, dv, torch.float64, with_g)
    init = (torch.randn(len(lens), nv, dv, dk, generator=gen, dtype=torch.float64)
            if with_init else None)
    out, final = _chunk(inp, lens, init)
    zeros = torch.zeros(len(lens), nv, dv, dk, dtype=torch.float64)
    want, _, finals = explicit_recurrence(inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"],
                                          dk ** -0.5, init if with_init else zeros, lens)
    assert out.shape == (t, nv, dv) and final.shape == (len(lens), nv, dv, dk)
    assert final.dtype == torch.float64
    torch.testing.assert_close(out, want, **F64_TOL)
    torch.testing.assert_close(final, torch.stack(finals), **F64_TOL)


@pytest.mark.parametrize("split", [1, 63, 64, 65, 100, 149])
def test_chunk_continuing_a_state_equals_one_pass_and_the_recurrent_form(split):
    gen = torch.Generator().manual_seed(split)
    n, nk, nv, dk, dv = 150, 1, 2, 5, 4
    inp = gdn_inputs(gen, n, nk, nv, dk, dv, torch.float64)
    s0 = torch.randn(1, nv, dv, dk, generator=gen, dtype=torch.float64)
    whole_out, whole_final = _chunk(inp, [n], s0)
    first = {k: (None if x is None else x[:split]) for k, x in inp.items()}
    second = {k: (None if x is None else x[split:]) for k, x in inp.items()}
    o1, s1 = _chunk(first, [split], s0)
    o2, s2 = _chunk(second, [n - split], s1)
    torch.testing.assert_close(torch.cat([o1, o2]), whole_out, **F64_TOL)
    torch.testing.assert_close(s2, whole_final, **F64_TOL)
    # The recurrent form over the same tokens (one slot per token) ends in the same state.
    state = torch.zeros(n + 1, nv, dv, dk, dtype=torch.float64)
    state[0] = s0[0]
    rec_out = _recurrent(recurrent_gated_delta_rule_reference, inp, state, [n],
                         range(n), None)
    torch.testing.assert_close(rec_out, whole_out, **F64_TOL)
    torch.testing.assert_close(state[n - 1], whole_final[0], **F64_TOL)


def test_chunk_without_initial_state_starts_from_zeros():
    gen = torch.Generator().manual_seed(7)
    inp = gdn_inputs(gen, 70, 1, 1, 4, 4, torch.float32)
    o1, f1 = _chunk(inp, [3, 67], None)
    o2, f2 = _chunk(inp, [3, 67], torch.zeros(2, 1, 4, 4))
    assert f1.dtype == torch.float32 and o1.dtype == torch.float32
    torch.testing.assert_close(o1, o2, rtol=0, atol=0)
    torch.testing.assert_close(f1, f2, rtol=0, atol=0)
    assert torch.equal(o1, chunk_gated_delta_rule_reference(
        inp["q"], inp["k"], inp["v"], beta=inp["beta"], actual_seq_lengths=_i32([3, 67]),
        scale=0.5, g=inp["g"])[0])


# --------------------------------------------------- 3. the speculative state scheme
def _ext_wrapper(*args, actual_seq_lengths, **kw):
    return npu_recurrent_gated_delta_rule_ext(
        *args, actual_seq_lengths=actual_seq_lengths,
        max_seq_len=int(actual_seq_lengths.max()), **kw)


SPEC_IMPLS = {"npu_recurrent_gated_delta_rule": npu_recurrent_gated_delta_rule,
              "npu_recurrent_gated_delta_rule_ext": _ext_wrapper}


@pytest.mark.parametrize("impl", sorted(SPEC_IMPLS))
def test_verify_slots_hold_what_plain_decodes_of_the_accepted_prefix_leave(impl):
    fn = SPEC_IMPLS[impl]
    gen = torch.Generator().manual_seed(11)
    nk, nv, dk, dv, spec = 1, 2, 8, 6, 4
    rows = 2
    verify = gdn_inputs(gen, rows * spec, nk, nv, dk, dv, torch.float32)   # [x0, d1, d2, d3]
    nxt = gdn_inputs(gen, rows * spec, nk, nv, dk, dv, torch.float32)      # next step's row
    n_slots = rows * spec + 2
    slots = torch.randperm(n_slots, generator=gen)[:rows * spec].tolist()
    row_slots = [slots[r * spec:(r + 1) * spec] for r in range(rows)]
    s_init = torch.randn(rows, nv, dv, dk, generator=gen)
    base = torch.randn(n_slots, nv, dv, dk, generator=gen)
    for r in range(rows):
        base[row_slots[r][0]] = s_init[r]           # the previous step left S in slot 0

    state = base.clone()
    out_v = fn(verify["q"], verify["k"], verify["v"], state, beta=verify["beta"],
               scale=dk ** -0.5, actual_seq_lengths=_i32([spec] * rows),
               ssm_state_indices=_i32(slots), num_accepted_tokens=None, g=verify["g"])

    # A plain one-token decode of x0 from S leaves bitwise the state in token 0's slot.
    first = [r * spec for r in range(rows)]
    dec = {k: x[first] for k, x in verify.items()}
    dec_state = base.clone()
    out_d = fn(dec["q"], dec["k"], dec["v"], dec_state, beta=dec["beta"], scale=dk ** -0.5,
               actual_seq_lengths=_i32([1] * rows),
               ssm_state_indices=_i32(row_slots[r][0] for r in range(rows)),
               num_accepted_tokens=None, g=dec["g"])
    for r in range(rows):
        assert torch.equal(state[row_slots[r][0]], dec_state[row_slots[r][0]])
        assert torch.equal(out_v[first[r]], out_d[r])

    # Next step, accepted = a: start from slot a-1 == a plain prefill of the accepted prefix
    # followed by the next step's tokens.
    for accepted in ([1, 4], [2, 3], [3, 1], [4, 2]):
        st2 = state.clone()
        out_n = fn(nxt["q"], nxt["k"], nxt["v"], st2, beta=nxt["beta"], scale=dk ** -0.5,
                   actual_seq_lengths=_i32([spec] * rows), ssm_state_indices=_i32(slots),
                   num_accepted_tokens=_i32(accepted), g=nxt["g"])
        order, lens = [], []
        for r, a in enumerate(accepted):
            order += [("v", r * spec + i) for i in range(a)] + [("n", r * spec + i)
                                                               for i in range(spec)]
            lens.append(a + spec)
        plain = {k: torch.stack([(verify if src == "v" else nxt)[k][i] for src, i in order])
                 for k in verify}
        plain_state = torch.zeros(sum(lens) + 1, nv, dv, dk)
        p_starts = _starts(lens)
        for r in range(rows):
            plain_state[p_starts[r]] = s_init[r]
        out_p = fn(plain["q"], plain["k"], plain["v"], plain_state, beta=plain["beta"],
                   scale=dk ** -0.5, actual_seq_lengths=_i32(lens),
                   ssm_state_indices=_i32(range(sum(lens))), num_accepted_tokens=None,
                   g=plain["g"])
        want, after, _ = explicit_recurrence(plain["q"], plain["k"], plain["v"], plain["g"],
                                             plain["beta"], dk ** -0.5, s_init, lens)
        torch.testing.assert_close(out_p.double(), want, **F32_TOL)
        for r, a in enumerate(accepted):
            p0 = p_starts[r]
            # the verify step's slot a-1 holds the state of the accepted prefix
            torch.testing.assert_close(state[row_slots[r][a - 1]].double(), after[p0 + a - 1],
                                       **F32_TOL)
            for i in range(spec):
                torch.testing.assert_close(out_n[r * spec + i], out_p[p0 + a + i], **F32_TOL)
                torch.testing.assert_close(st2[row_slots[r][i]], plain_state[p0 + a + i],
                                           **F32_TOL)


# ----------------------------------------------------------- 4. the plugin's own op
@needs_compiled
@SETTINGS
@given(lens=st.lists(st.integers(1, 11), min_size=1, max_size=4), nk=st.sampled_from([1, 2]),
       rep=st.sampled_from([1, 2]), dk=st.integers(4, 8), dv=st.integers(4, 8),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]), with_g=st.booleans(),
       use_accepted=st.booleans(), init_mode=st.sampled_from(["none", "all", "mix"]),
       extra=st.integers(0, 3), seed=st.integers(0, 2**16), data=st.data())
def test_ext_kernel_equals_reference(lens, nk, rep, dk, dv, dtype, with_g, use_accepted,
                                     init_mode, extra, seed, data):
    gen, t, nv, inp, n_slots, slots, accepted = _draw_case(seed, lens, nk, rep, dk, dv, dtype,
                                                           with_g, use_accepted, data)
    has_init = (None if init_mode == "none" else
                torch.tensor([True] * len(lens) if init_mode == "all"
                             else data.draw(st.lists(st.booleans(), min_size=len(lens),
                                                     max_size=len(lens)))))
    state = torch.randn(n_slots, nv, dv, dk, generator=gen).to(dtype)
    s_ref, s_ker = state.clone(), state.clone()
    kw = dict(has_initial_state=has_init, max_seq_len=max(lens) + extra)
    o_ref = _recurrent(recurrent_gdr_ext_reference, inp, s_ref, lens, slots, accepted, **kw)
    o_ker = _recurrent(_compiled_ext, inp, s_ker, lens, slots, accepted, **kw)
    tol = F32_TOL if dtype == torch.float32 else dict(rtol=2e-2, atol=3e-2)
    assert o_ker.dtype == o_ref.dtype == dtype and s_ker.dtype == dtype
    torch.testing.assert_close(o_ker, o_ref, **tol)
    torch.testing.assert_close(s_ker, s_ref, **tol)
    for slot in set(range(n_slots)) - set(slots):
        assert torch.equal(s_ker[slot], state[slot])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lens=st.lists(st.integers(1, 10), min_size=1, max_size=4), rep=st.sampled_from([1, 2]),
       with_g=st.booleans(), use_accepted=st.booleans(), seed=st.integers(0, 2**16),
       data=st.data())
def test_ext_reference_and_wrapper_match_explicit_loop(lens, rep, with_g, use_accepted, seed,
                                                       data):
    """has_initial_state False rows start from zeros; the rest from slot accepted-1."""
    gen = torch.Generator().manual_seed(seed)
    t, nk, dk, dv = sum(lens), 2, 4, 5
    nv = nk * rep
    inp = gdn_inputs(gen, t, nk, nv, dk, dv, torch.float64, with_g)
    slots = torch.randperm(t + 2, generator=gen)[:t].tolist()
    accepted = [data.draw(st.integers(1, n)) for n in lens] if use_accepted else None
    has_init = data.draw(st.lists(st.booleans(), min_size=len(lens), max_size=len(lens)))
    before = torch.randn(t + 2, nv, dv, dk, generator=gen, dtype=torch.float64)
    init = [before[slots[s + (accepted[b] if accepted else 1) - 1]] if has_init[b]
            else torch.zeros(nv, dv, dk, dtype=torch.float64)
            for b, s in enumerate(_starts(lens))]
    want, after, _ = explicit_recurrence(inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"],
                                         dk ** -0.5, init, lens)
    for fn in (recurrent_gdr_ext_reference, npu_recurrent_gated_delta_rule_ext):
        state = before.clone()
        out = _recurrent(fn, inp, state, lens, slots, accepted,
                         has_initial_state=torch.tensor(has_init), max_seq_len=max(lens))
        torch.testing.assert_close(out, want, **F64_TOL)
        _check_slots(state, before, slots, after, F64_TOL)


@pytest.mark.parametrize("lens", [[3, 9], [0, 2]])
def test_ext_reference_refuses_lengths_outside_one_to_max_seq_len(lens):
    gen = torch.Generator().manual_seed(8)
    t = sum(lens)
    inp = gdn_inputs(gen, t, 1, 1, 4, 4, torch.float32)
    with pytest.raises(ValueError, match="max_seq_len"):
        _recurrent(recurrent_gdr_ext_reference, inp, torch.zeros(t, 1, 4, 4), lens, range(t),
                   max_seq_len=8)


# ---------------------------------------------------------------------- 5. the conv op
def explicit_conv(x, weight, states, lens, slots, init, bias, accepted, silu, pad=-1):
    """Per request, per token, per channel, in float64 (Python floats). Returns
    (y [T, dim], the whole conv_states tensor after the op)."""
    k, dim = weight.shape
    sl = states.shape[1]
    w = weight.double().tolist()
    xs = x.double().tolist()
    old = states.double()
    new = old.clone()
    y = torch.zeros(x.shape, dtype=torch.float64)
    for b, (start, n) in enumerate(zip(_starts(lens), lens)):
        c = slots[b]
        real = c != pad
        off = accepted[b] - 1 if accepted is not None else 0
        hist = [old[c, off + r].tolist() if real and init[b] else [0.0] * dim
                for r in range(k - 1)]
        seq = hist + xs[start:start + n]
        for t in range(n):
            for d in range(dim):
                acc = sum(w[j][d] * seq[t + j][d] for j in range(k))
                if bias is not None:
                    acc += float(bias[d])
                y[start + t, d] = acc / (1.0 + math.exp(-acc)) if silu else acc
        if real and n > 0:
            shift = 1 if accepted is not None else n
            for r in range(min(sl, k - 1 + n - shift)):
                new[c, r] = torch.tensor(seq[shift + r], dtype=torch.float64)
    return y, new


@st.composite
def conv_cases(draw, allow_pad=True, lowest_slot=0):
    """Ragged rows with distinct slots in [lowest_slot, N); pad rows (-1) if allowed."""
    b = draw(st.integers(1, 4))
    lens = draw(st.lists(st.integers(1, 6), min_size=b, max_size=b))
    k = draw(st.sampled_from([2, 3, 4]))
    spec = draw(st.sampled_from([0, 3]))
    n_slots = b + 2
    slots = draw(st.permutations(range(lowest_slot, n_slots)))[:b]
    if allow_pad:
        pads = draw(st.lists(st.booleans(), min_size=b, max_size=b))
        slots = [-1 if p else s for s, p in zip(slots, pads)]
    use_acc = draw(st.booleans())
    accepted = ([draw(st.integers(1, spec + 1)) for _ in range(b)] if use_acc else None)
    return dict(lens=lens, k=k, sl=k - 1 + spec, n_slots=n_slots, slots=list(slots),
                accepted=accepted, init=draw(st.lists(st.booleans(), min_size=b, max_size=b)),
                dim=draw(st.integers(2, 5)), bias=draw(st.booleans()), silu=draw(st.booleans()),
                seed=draw(st.integers(0, 2**16)))


def _conv_tensors(case, dtype):
    gen = torch.Generator().manual_seed(case["seed"])
    t, dim = sum(case["lens"]), case["dim"]
    x = torch.randn(t, dim, generator=gen, dtype=torch.float64).to(dtype)
    w = torch.randn(case["k"], dim, generator=gen, dtype=torch.float64).to(dtype)
    bias = torch.randn(dim, generator=gen, dtype=torch.float64).to(dtype) if case["bias"] else None
    # strided: conv_states is a transposed view, as in a [N, dim, state_len] cache
    states = torch.randn(case["n_slots"], dim, case["sl"], generator=gen,
                         dtype=torch.float64).to(dtype).transpose(1, 2)
    return x, w, bias, states


def _conv(fn, case, x, w, bias, states):
    lens = case["lens"]
    qsl = _i32([0] + [sum(lens[:i + 1]) for i in range(len(lens))])
    return fn(x, w, states, qsl, _i32(case["slots"]), torch.tensor(case["init"]), bias=bias,
              num_accepted_tokens=None if case["accepted"] is None else _i32(case["accepted"]),
              silu=case["silu"], pad_slot_id=-1)


@SETTINGS
@given(case=conv_cases())
def test_conv_reference_matches_explicit_loop(case):
    x, w, bias, states = _conv_tensors(case, torch.float64)
    assert states.stride(1) == 1                    # a transposed (strided) view
    before = states.clone()
    y = _conv(causal_conv1d_reference, case, x, w, bias, states)
    want_y, want_states = explicit_conv(x, w, before, case["lens"], case["slots"], case["init"],
                                        bias, case["accepted"], case["silu"])
    torch.testing.assert_close(y, want_y, **F64_TOL)
    torch.testing.assert_close(states, want_states, rtol=0, atol=0)


@needs_compiled
@SETTINGS
@given(case=conv_cases(allow_pad=False), dtype=st.sampled_from([torch.float32, torch.float64]))
def test_conv_kernel_equals_reference(case, dtype):
    x, w, bias, states = _conv_tensors(case, dtype)
    s_ref, s_ker = states.clone(), states.clone()
    y_ref = _conv(causal_conv1d_reference, case, x, w, bias, s_ref)
    y_ker = _conv(torch.ops._C_ascend_ext.npu_causal_conv1d_ext, case, x, w, bias, s_ker)
    assert y_ker.dtype == dtype
    torch.testing.assert_close(y_ker, y_ref, **_tol(dtype))
    assert torch.equal(s_ker, s_ref)


@needs_compiled
@SETTINGS
@given(case=conv_cases(allow_pad=True, lowest_slot=1))
def test_conv_kernel_equals_reference_with_pad_rows(case):
    """Pad rows (cache index -1) among real rows (slot 0 itself: the next test)."""
    x, w, bias, states = _conv_tensors(case, torch.float32)
    s_ref, s_ker = states.clone(), states.clone()
    y_ref = _conv(causal_conv1d_reference, case, x, w, bias, s_ref)
    y_ker = _conv(torch.ops._C_ascend_ext.npu_causal_conv1d_ext, case, x, w, bias, s_ker)
    torch.testing.assert_close(y_ker, y_ref, **F32_TOL)
    assert torch.equal(s_ker, s_ref), f"state differs: slots {case['slots']}"


@needs_compiled
@pytest.mark.parametrize("accepted", [None, [1, 1]])
def test_conv_kernel_pad_row_after_a_real_row_in_slot_0(accepted):
    """Regression: the kernel once clamped a pad row's index -1 to slot 0 and wrote slot
    0's old rows back over a real row's update (duplicate indices in one scatter)."""
    case = dict(lens=[2, 1], k=3, sl=5, n_slots=2, slots=[0, -1], accepted=accepted,
                init=[True, True], dim=2, bias=False, silu=False, seed=2)
    x, w, _, states = _conv_tensors(case, torch.float32)
    s_ref, s_ker = states.clone(), states.clone()
    _conv(causal_conv1d_reference, case, x, w, None, s_ref)
    _conv(torch.ops._C_ascend_ext.npu_causal_conv1d_ext, case, x, w, None, s_ker)
    assert not torch.equal(s_ref[0], states[0])          # the real row wrote slot 0
    assert torch.equal(s_ker, s_ref)


def test_conv_pad_row_reads_zeros_and_writes_nothing():
    k, dim, sl = 4, 3, 6
    case = dict(lens=[3, 2], k=k, sl=sl, n_slots=3, slots=[-1, 1], accepted=None,
                init=[True, True], dim=dim, bias=False, silu=False, seed=1)
    x, w, _, states = _conv_tensors(case, torch.float64)
    before = states.clone()
    y = _conv(causal_conv1d_reference, case, x, w, None, states)
    # the pad row: y[t] = sum over its own inputs only (zero history)
    for t in range(3):
        want = sum(w[j] * x[t + j - (k - 1)] for j in range(k) if t + j - (k - 1) >= 0)
        torch.testing.assert_close(y[t], want, **F64_TOL)
    assert torch.equal(states[0], before[0]) and torch.equal(states[2], before[2])
    assert not torch.equal(states[1], before[1])          # the real row did write


CONV_IMPLS = {"reference": causal_conv1d_reference, "npu_causal_conv1d_ext": npu_causal_conv1d_ext}


@pytest.mark.parametrize("impl", sorted(CONV_IMPLS))
@pytest.mark.parametrize("k", [2, 3, 4])
def test_conv_verify_windows_equal_plain_decodes(impl, k):
    """After a verify row of L tokens (state_len = K-1+num_spec, num_accepted mode), the
    window at offset a-1 is what plain one-token decodes of the first a tokens leave, and
    next step's token a computes as a plain decode would."""
    fn = CONV_IMPLS[impl]
    spec, dim, c = 3, 4, 1
    sl = k - 1 + spec
    gen = torch.Generator().manual_seed(20 + k)
    w = torch.randn(k, dim, generator=gen)
    bias = torch.randn(dim, generator=gen)
    for a_prev in range(1, spec + 2):
        for n in range(1, spec + 2):
            x = torch.randn(n, dim, generator=gen)
            z = torch.randn(1, dim, generator=gen)
            spec_states = torch.randn(2, dim, sl, generator=gen).transpose(1, 2)
            hist0 = spec_states[c, a_prev - 1:a_prev - 1 + k - 1].clone()
            y_spec = fn(x, w, spec_states, _i32([0, n]), _i32([c]), torch.tensor([True]),
                        bias=bias, num_accepted_tokens=_i32([a_prev]))
            plain = torch.randn(2, k - 1, dim, generator=gen)
            plain[c] = hist0
            windows, y_plain = [], []
            for i in range(n):
                y_plain.append(fn(x[i:i + 1], w, plain, _i32([0, 1]), _i32([c]),
                                  torch.tensor([True]), bias=bias))
                windows.append(plain[c].clone())
                # the plain state is the last K-1 inputs (independent check)
                seq = torch.cat([hist0, x[:i + 1]])
                assert torch.equal(plain[c], seq[-(k - 1):])
            torch.testing.assert_close(y_spec, torch.cat(y_plain), **F32_TOL)
            for a in range(1, n + 1):
                assert torch.equal(spec_states[c, a - 1:a - 1 + k - 1], windows[a - 1]), (
                    a_prev, n, a)
                nxt = spec_states.clone()
                y_next = fn(z, w, nxt, _i32([0, 1]), _i32([c]), torch.tensor([True]),
                            bias=bias, num_accepted_tokens=_i32([a]))
                dec = torch.zeros(2, k - 1, dim)
                dec[c] = windows[a - 1]
                y_dec = fn(z, w, dec, _i32([0, 1]), _i32([c]), torch.tensor([True]), bias=bias)
                torch.testing.assert_close(y_next, y_dec, **F32_TOL)


# ----------------------------------------------------------------------- 6. the gates
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_gates_match_the_formula(dtype):
    gen = torch.Generator().manual_seed(9)
    t, nv = 7, 3
    a = (torch.randn(t, nv, generator=gen) * 8).to(dtype)
    a[0, 0], a[1, 1] = 25.0, -30.0                 # past the softplus threshold; deep negative
    b = (torch.randn(t, nv, generator=gen) * 3).to(dtype)
    a_log = torch.randn(nv, generator=gen).to(dtype)
    dt_bias = torch.randn(nv, generator=gen).to(dtype)
    g, beta = gdn_gates(a, b, a_log, dt_bias)
    assert g.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert beta.dtype == dtype and g.shape == beta.shape == (t, nv)
    for i in range(t):
        for h in range(nv):
            u = float(a[i, h]) + float(dt_bias[h])
            want_g = -math.exp(float(a_log[h])) * math.log1p(math.exp(u))
            want_b = 1.0 / (1.0 + math.exp(-float(b[i, h])))
            tol_g = 1e-9 if dtype == torch.float64 else 1e-5
            assert math.isclose(float(g[i, h]), want_g, rel_tol=tol_g, abs_tol=tol_g)
            tol_b = {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 8e-3}[dtype]
            assert math.isclose(float(beta[i, h]), want_b, rel_tol=0, abs_tol=tol_b)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_l2norm_matches_the_formula(dtype):
    gen = torch.Generator().manual_seed(10)
    x = torch.randn(4, 2, 6, generator=gen).to(dtype)
    x[0, 0] = 0.0                                    # a zero vector stays zero (eps)
    x[1, 1] = 1e-4
    y = l2norm(x)
    assert y.dtype == dtype and y.shape == x.shape
    tol = {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 1e-2}[dtype]
    for i in range(4):
        for h in range(2):
            row = [float(v) for v in x[i, h]]
            denom = math.sqrt(sum(v * v for v in row) + 1e-6)
            for d, v in enumerate(row):
                assert math.isclose(float(y[i, h, d]), v / denom, rel_tol=tol, abs_tol=tol)


# ------------------------------------------------------------------------- 7. meta
def test_public_wrappers_on_meta_give_shapes_and_dtypes():
    t, nk, nv, dk, dv, b, n = 6, 2, 4, 8, 5, 2, 9
    m = dict(device="meta")
    q = torch.empty(t, nk, dk, dtype=torch.bfloat16, **m)
    v = torch.empty(t, nv, dv, dtype=torch.bfloat16, **m)
    beta = torch.empty(t, nv, dtype=torch.bfloat16, **m)
    g = torch.empty(t, nv, dtype=torch.float32, **m)
    lens = torch.empty(b, dtype=I32, **m)
    idx = torch.empty(t, dtype=I32, **m)
    state = torch.empty(n, nv, dv, dk, dtype=torch.bfloat16, **m)
    out = npu_recurrent_gated_delta_rule(q, q, v, state, beta=beta, scale=0.3,
                                         actual_seq_lengths=lens, ssm_state_indices=idx,
                                         num_accepted_tokens=torch.empty(b, dtype=I32, **m), g=g)
    assert out.device.type == "meta" and out.shape == (t, nv, dv) and out.dtype == torch.bfloat16
    out = npu_recurrent_gated_delta_rule_ext(q, q, v, state, beta=beta, scale=0.3,
                                             actual_seq_lengths=lens, ssm_state_indices=idx,
                                             g=g, has_initial_state=torch.empty(b, dtype=torch.bool, **m),
                                             max_seq_len=4)
    assert out.device.type == "meta" and out.shape == (t, nv, dv) and out.dtype == torch.bfloat16
    for init, sdt in ((None, torch.bfloat16),
                      (torch.empty(b, nv, dv, dk, dtype=torch.float32, **m), torch.float32)):
        out, final = npu_chunk_gated_delta_rule(q, q, v, beta=beta, initial_state=init,
                                                actual_seq_lengths=lens, scale=0.3, g=g)
        assert out.device.type == "meta" and out.shape == (t, nv, dv)
        assert out.dtype == torch.bfloat16
        assert final.device.type == "meta" and final.shape == (b, nv, dv, dk)
        assert final.dtype == sdt
    x = torch.empty(t, 12, dtype=torch.bfloat16, **m)
    y = npu_causal_conv1d_ext(x, torch.empty(4, 12, dtype=torch.bfloat16, **m),
                              torch.empty(3, 12, 6, dtype=torch.bfloat16, **m).transpose(1, 2),
                              torch.empty(b + 1, dtype=I32, **m), torch.empty(b, dtype=I32, **m),
                              torch.empty(b, dtype=torch.bool, **m),
                              bias=torch.empty(12, dtype=torch.bfloat16, **m),
                              num_accepted_tokens=torch.empty(b, dtype=I32, **m))
    assert y.device.type == "meta" and y.shape == (t, 12) and y.dtype == torch.bfloat16


# ------------------------------------------------------------- fallback (hidden library)
def test_hidden_library_falls_back_to_the_references():
    code = r"""
import sys, torch
sys.modules["vllm_ascend_ext._C_ascend_ext"] = None          # hide the compiled library
from vllm_ascend_ext.ops import _ext
from vllm_ascend_ext.ops.causal_conv1d import npu_causal_conv1d_ext, causal_conv1d_reference
from vllm_ascend_ext.ops.gdn_ext import npu_recurrent_gated_delta_rule_ext, recurrent_gdr_ext_reference
g = torch.Generator().manual_seed(0)
q = torch.nn.functional.normalize(torch.randn(5, 1, 4, generator=g), dim=-1)
v, beta = torch.randn(5, 2, 4, generator=g), torch.rand(5, 2, generator=g)
kw = dict(beta=beta, scale=0.5, actual_seq_lengths=torch.tensor([2, 3], dtype=torch.int32),
          ssm_state_indices=torch.tensor([4, 0, 2, 1, 5], dtype=torch.int32),
          num_accepted_tokens=torch.tensor([2, 1], dtype=torch.int32),
          has_initial_state=torch.tensor([True, False]), max_seq_len=3)
s1 = torch.randn(6, 2, 4, 4, generator=g); s2 = s1.clone()
o1 = npu_recurrent_gated_delta_rule_ext(q, q, v, s1, **kw)
o2 = recurrent_gdr_ext_reference(q, q, v, s2, **kw)
x, w = torch.randn(5, 3, generator=g), torch.randn(4, 3, generator=g)
c1 = torch.randn(3, 3, 5, generator=g).transpose(1, 2); c2 = c1.clone()
args = (torch.tensor([0, 2, 5], dtype=torch.int32), torch.tensor([2, -1], dtype=torch.int32),
        torch.tensor([True, True]))
y1 = npu_causal_conv1d_ext(x, w, c1, *args, num_accepted_tokens=torch.tensor([2, 1], dtype=torch.int32))
y2 = causal_conv1d_reference(x, w, c2, *args, num_accepted_tokens=torch.tensor([2, 1], dtype=torch.int32))
assert not _ext.load()
assert torch.equal(o1, o2) and torch.equal(s1, s2) and torch.equal(y1, y2) and torch.equal(c1, c2)
print("FALLBACK-OK", _ext.registered_ops())
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "FALLBACK-OK []" in proc.stdout, proc.stderr[-2000:]
