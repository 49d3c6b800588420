"""The GDN layer's per-step plan, builder and core, without vLLM's engine.

- ``plan_spans``: which rows take the recurrent / prefill path, ordering, refusals;
- the builder + core on ``meta`` tensors (nothing can read device data there), for
  plain, speculative (full and ragged verify rows) and mixed steps, on both op tables;
- the core over several steps against an explicit float64 per-request model of the
  layer (conv window, gates, L2 norm, delta rule): prefills continuing a state,
  decodes, verify rows with 0..3 accepted drafts, a verify row shorter than the previous
  accepted count (the guard path), and the guard's bitwise promise.
"""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import torch

from vllm_ascend_ext.attention.gdn.builder import AscendGdnMetadataBuilder
from vllm_ascend_ext.attention.gdn.core import GdnDims, GdnWeights, gdn_core
from vllm_ascend_ext.attention.gdn.ops_table import gdn_ops_for
from vllm_ascend_ext.attention.gdn.spans import GdnBatchError, plan_spans

NK, NV, DK, DV, K = 2, 4, 8, 6, 4
DIMS = GdnDims(NK, NV, DK, DV)
CONV_DIM = 2 * NK * DK + NV * DV


# --- plan_spans ---------------------------------------------------------------------------

def test_plain_step_decode_first():
    s = plan_spans([1, 1, 5, 3, 0], [7, 2, 0, 4, 0], None, 0)
    assert s.rec_rows == (0, 1) and s.pre_rows == (2, 3)
    assert s.pre_has_state == (False, True) and s.token_order is None
    assert s.kind == "decode+prefill" and (s.rec_tokens, s.pre_tokens) == (2, 8)


def test_one_token_first_chunk_is_a_prefill():
    s = plan_spans([1], [0], None, 0)
    assert s.pre_rows == (0,) and s.pre_has_state == (False,)


def test_speculative_rows_and_reordered_short_prefill():
    # vLLM's reorder puts short rows first: a 2-token prompt chunk among verify rows
    s = plan_spans([4, 2, 1, 6], [9, 3, 5, 0], [3, -1, 0, -1], 3)
    assert s.rec_rows == (0, 2) and s.pre_rows == (1, 3) and s.speculative
    assert s.token_order == (0, 1, 2, 3, 6, 4, 5, 7, 8, 9, 10, 11, 12)


@pytest.mark.parametrize("q,drafts,msg", [([3], [3], "3 tokens for 3 drafts"),
                                          ([5], [4], "num_speculative_tokens")])
def test_inconsistent_draft_rows_fail_loudly(q, drafts, msg):
    with pytest.raises(GdnBatchError, match=msg):
        plan_spans(q, [4], drafts, 3)


def test_mismatched_host_lists_fail_loudly():
    with pytest.raises(GdnBatchError, match="2 query lengths, 1 computed"):
        plan_spans([1, 1], [3], None, 0)


# --- builder + core -----------------------------------------------------------------------

def builder(num_spec: int) -> AscendGdnMetadataBuilder:
    b = AscendGdnMetadataBuilder.__new__(AscendGdnMetadataBuilder)
    b.num_spec, b.use_spec_decode, b.kv_cache_spec = num_spec, num_spec > 0, None
    b.vllm_config = SimpleNamespace(cache_config=SimpleNamespace(mamba_cache_mode="none"))
    return b


def cam(query, computed, table, device):
    qsl = [0]
    for q in query:
        qsl.append(qsl[-1] + q)
    return SimpleNamespace(
        num_reqs=len(query), num_actual_tokens=qsl[-1],
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        query_start_loc_cpu=torch.tensor(qsl, dtype=torch.int32),
        seq_lens_cpu_upper_bound=torch.tensor([c + q for c, q in zip(computed, query)]),
        seq_lens=torch.tensor([c + q for c, q in zip(computed, query)], device=device),
        block_table_tensor=torch.tensor(table, dtype=torch.int32, device=device))


def weights(dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    return GdnWeights(conv_weight=(torch.randn(K, CONV_DIM, generator=g) / 2).to(dtype).to(device),
                      conv_bias=None, a_log=(torch.rand(NV, generator=g) - 1).to(device),
                      dt_bias=torch.rand(NV, generator=g).to(device), silu=True)


def run_step(b, query, computed, table, drafts, accepted, conv, ssm, x, bb, aa, family,
             device="cpu"):
    spans_md = b.build(0, cam(query, computed, table, device),
                       num_accepted_tokens=(None if accepted is None else
                                            torch.tensor(accepted, dtype=torch.int32,
                                                         device=device)),
                       num_decode_draft_tokens_cpu=(None if drafts is None
                                                    else torch.tensor(drafts)))
    out = torch.zeros(x.shape[0], NV, DV, dtype=x.dtype, device=device)
    ops = gdn_ops_for("A3", num_spec=8) if family == "A3-spec8" else gdn_ops_for(family)
    gdn_core(spans_md, ops, DIMS, weights(x.dtype, device), conv, ssm, x, bb,
             aa, out)
    return spans_md, out


@pytest.mark.parametrize("family", ["A2", "A5", "A3-spec8"])
@pytest.mark.parametrize("case", ["plain", "mixed", "spec_full", "spec_ragged", "spec_mixed"])
def test_builder_and_core_run_on_meta_tensors(family, case):
    """Meta tensors carry no data: any host read of device values would raise here."""
    num_spec = 0 if case in ("plain", "mixed") else 3
    query, computed, drafts, accepted = {
        "plain": ([1, 1, 1], [5, 9, 2], None, None),
        "mixed": ([1, 1, 7], [5, 9, 0], None, None),
        "spec_full": ([4, 4], [5, 9], [3, 3], [1, 4]),
        "spec_ragged": ([2, 4, 1], [5, 9, 3], [1, 3, 0], [3, 1, 2]),
        "spec_mixed": ([4, 3, 6], [5, 2, 0], [3, -1, -1], [2, 1, 1]),
    }[case]
    table = [[1 + 4 * i + j for j in range(num_spec + 1)] for i in range(len(query))]
    n = sum(query)
    dev = torch.device("meta")
    conv = torch.empty(20, CONV_DIM, K - 1 + num_spec, device=dev).transpose(1, 2)
    ssm = torch.empty(20, NV, DV, DK, device=dev)
    md, out = run_step(builder(num_spec), query, computed, table, drafts, accepted, conv, ssm,
                       torch.empty(n, CONV_DIM, device=dev), torch.empty(n, NV, device=dev),
                       torch.empty(n, NV, device=dev), family, device=dev)
    assert out.device.type == "meta" and md.num_tokens == n
    if case == "spec_full":
        assert md.accepted_in_op
    if case == "spec_ragged":
        assert not md.accepted_in_op  # the guard path


# --- the core against an explicit model ---------------------------------------------------

class Explicit:
    """Per request, float64: conv history (inputs), state S [NV, DV, DK]."""

    def __init__(self, w: GdnWeights):
        self.w = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in vars(w).items()}
        self.hist: dict[int, list] = {}
        self.state: dict[int, torch.Tensor] = {}

    def token(self, req, x, b, a):
        h = self.hist.setdefault(req, [torch.zeros(CONV_DIM, dtype=torch.float64)] * (K - 1))
        window = h[-(K - 1):] + [x.double()]
        y = sum(self.w["conv_weight"][j] * window[j] for j in range(K))
        y = y * torch.sigmoid(y)
        self.hist[req] = window
        q, k, v = y[:NK * DK].view(NK, DK), y[NK * DK:2 * NK * DK].view(NK, DK), y[2 * NK * DK:].view(NV, DV)
        s = self.state.setdefault(req, torch.zeros(NV, DV, DK, dtype=torch.float64))
        out = torch.zeros(NV, DV, dtype=torch.float64)
        for hd in range(NV):
            kk = k[hd // (NV // NK)]
            kk = kk / math.sqrt(float((kk * kk).sum()) + 1e-6)
            qq = q[hd // (NV // NK)]
            qq = qq / math.sqrt(float((qq * qq).sum()) + 1e-6) * DK ** -0.5
            sp = math.log1p(math.exp(float(a[hd]) + float(self.w["dt_bias"][hd])))
            decay = math.exp(-math.exp(float(self.w["a_log"][hd])) * sp)
            beta = 1 / (1 + math.exp(-float(b[hd])))
            s[hd] = s[hd] * decay
            s[hd] = s[hd] + torch.outer((v[hd] - s[hd] @ kk) * beta, kk)
            out[hd] = s[hd] @ qq
        return out

    def snapshot(self, req):
        return [t.clone() for t in self.hist[req]], self.state[req].clone()

    def restore(self, req, snap):
        self.hist[req], self.state[req] = [t.clone() for t in snap[0]], snap[1].clone()


@pytest.mark.parametrize("family", ["A2", "A5", "A3-spec8"])
def test_core_matches_explicit_model_over_plain_and_speculative_steps(family):
    """Three requests: chunked prefill (continuing a state), then verify steps with ragged
    drafts and random acceptance, including a row shorter than its previous accepted
    count; the explicit model runs only the accepted tokens, as plain decoding would."""
    rnd = random.Random(1)
    torch.manual_seed(1)
    num_spec, dtype = 3, torch.float64
    b = builder(num_spec)
    w = weights(dtype, "cpu")
    ref = Explicit(w)
    table = [[1 + 4 * i + j for j in range(num_spec + 1)] for i in range(3)]
    conv = torch.randn(16, CONV_DIM, K - 1 + num_spec, dtype=dtype).transpose(1, 2)
    # garbage (first chunks must not read it), strided like vLLM's hybrid pages
    ssm = torch.randn(16, NV * DV * DK + 7, dtype=dtype)[:, 7:].view(16, NV, DV, DK)
    assert not ssm.is_contiguous()
    computed = [0, 0, 0]

    def inputs(n):
        return (torch.randn(n, CONV_DIM, dtype=dtype), torch.randn(n, NV, dtype=dtype),
                torch.randn(n, NV, dtype=dtype))

    # two prefill chunks per request (the second continues the state)
    for chunk in ([5, 3, 7], [4, 6, 2]):
        x, bb, aa = inputs(sum(chunk))
        _, out = run_step(b, chunk, computed, table, [-1] * 3, [1, 1, 1], conv, ssm, x, bb, aa,
                          family)
        t = 0
        for r, n in enumerate(chunk):
            for _ in range(n):
                torch.testing.assert_close(out[t], ref.token(r, x[t], bb[t], aa[t]),
                                           rtol=1e-9, atol=1e-9)
                t += 1
            computed[r] += n
    accepted = [1, 1, 1]
    for step in range(6):
        drafts = [rnd.randint(0, num_spec) for _ in range(3)]
        forced = None
        if step == 2:  # full verify rows; accept 2, 3 and 0 drafts
            drafts, forced = [3, 3, 3], [3, 4, 1]
        if step == 3:  # rows shorter than the accepted count they resume from
            drafts = [1, 0, 3]
        query = [d + 1 for d in drafts]
        x, bb, aa = inputs(sum(query))
        md, out = run_step(b, query, computed, table, drafts, accepted, conv, ssm, x, bb, aa,
                           family)
        assert md.speculative and md.accepted_in_op == all(q == num_spec + 1 for q in query)
        t, new_accepted = 0, []
        for r, n in enumerate(query):
            snap = ref.snapshot(r)
            outs = [ref.token(r, x[t + i], bb[t + i], aa[t + i]) for i in range(n)]
            for i in range(n):
                torch.testing.assert_close(out[t + i], outs[i], rtol=1e-9, atol=1e-9)
            a = forced[r] if forced else rnd.randint(1, n)  # a - 1 drafts accepted
            ref.restore(r, snap)
            for i in range(a):
                ref.token(r, x[t + i], bb[t + i], aa[t + i])
            computed[r] += a
            new_accepted.append(a)
            t += n
        accepted = new_accepted


def test_guard_leaves_a_no_draft_request_exactly_the_plain_decode_state():
    """fp32: a verify row whose drafts are all rejected ends (after the next step's guard)
    with bitwise the state and conv window a plain decode step leaves."""
    torch.manual_seed(3)
    dtype = torch.float32
    conv0 = torch.randn(8, CONV_DIM, K - 1 + 3, dtype=dtype).transpose(1, 2)
    ssm0 = torch.randn(8, NV, DV, DK, dtype=dtype)
    x, bb, aa = (torch.randn(4, CONV_DIM), torch.randn(4, NV), torch.randn(4, NV))
    # speculative engine: verify [x0, d1, d2, d3] for request 0 (slots 1..4)
    conv_s, ssm_s = conv0.clone(), ssm0.clone()
    run_step(builder(3), [4], [9], [[1, 2, 3, 4]], [3], [1], conv_s, ssm_s, x, bb, aa, "A2")
    # next step: no draft accepted (accepted = 1), a one-token row: the guard copies column 0
    from vllm_ascend_ext.attention.gdn.core import apply_accepted_guard

    apply_accepted_guard(ssm_s, torch.tensor([[1, 2, 3, 4]]), torch.tensor([1]))
    # plain engine: decode x0 alone from the same state (slot 1)
    conv_p, ssm_p = conv0[:, :K - 1].clone(), ssm0.clone()
    run_step(builder(0), [1], [9], [[1]], None, None, conv_p, ssm_p, x[:1], bb[:1], aa[:1], "A2")
    assert torch.equal(ssm_s[1], ssm_p[1])
    assert torch.equal(conv_s[1, :K - 1], conv_p[1, :K - 1])


def test_guard_moves_the_accepted_state_into_column_0():
    """Two drafts accepted (accepted = 3): after the guard, column 0 holds bitwise the
    state a plain engine has after decoding x0, d1, d2 one by one."""
    torch.manual_seed(4)
    from vllm_ascend_ext.attention.gdn.core import apply_accepted_guard

    conv0 = torch.randn(8, CONV_DIM, K - 1 + 3).transpose(1, 2)
    ssm0 = torch.randn(8, NV, DV, DK)
    x, bb, aa = (torch.randn(4, CONV_DIM), torch.randn(4, NV), torch.randn(4, NV))
    ssm_s = ssm0.clone()
    run_step(builder(3), [4], [9], [[1, 2, 3, 4]], [3], [1], conv0.clone(), ssm_s, x, bb, aa,
             "A2")
    before = ssm_s[3].clone()
    apply_accepted_guard(ssm_s, torch.tensor([[1, 2, 3, 4]]), torch.tensor([3]))
    assert torch.equal(ssm_s[1], before)
    conv_p, ssm_p = conv0[:, :K - 1].clone(), ssm0.clone()
    for t in range(3):
        run_step(builder(0), [1], [9 + t], [[1]], None, None, conv_p, ssm_p, x[t:t + 1],
                 bb[t:t + 1], aa[t:t + 1], "A2")
    torch.testing.assert_close(ssm_s[1], ssm_p[1], rtol=0, atol=1e-6)


@pytest.mark.parametrize("family", ["A2", "A5"])
def test_a_short_prompt_chunk_reordered_among_verify_rows(family):
    """vLLM puts short rows first: [verify(4), first chunk (2 tokens), verify(3)] is
    gathered into its spans and scattered back; outputs match the explicit model."""
    torch.manual_seed(5)
    dtype = torch.float64
    b = builder(3)
    ref = Explicit(weights(dtype, "cpu"))
    table = [[1 + 4 * i + j for j in range(4)] for i in range(3)]
    conv = torch.zeros(16, CONV_DIM, K - 1 + 3, dtype=dtype).transpose(1, 2)
    ssm = torch.randn(16, NV, DV, DK, dtype=dtype)
    # requests 0 and 2 have a state (a first prefill), request 1 starts now
    x0, b0, a0 = (torch.randn(6, CONV_DIM, dtype=dtype), torch.randn(6, NV, dtype=dtype),
                  torch.randn(6, NV, dtype=dtype))
    run_step(b, [3, 3], [0, 0], [table[0], table[2]], [-1, -1], [1, 1], conv, ssm, x0, b0, a0,
             family)
    for t in range(3):
        ref.token(0, x0[t], b0[t], a0[t])
        ref.token(2, x0[3 + t], b0[3 + t], a0[3 + t])
    x, bb, aa = (torch.randn(9, CONV_DIM, dtype=dtype), torch.randn(9, NV, dtype=dtype),
                 torch.randn(9, NV, dtype=dtype))
    md, out = run_step(b, [4, 2, 3], [3, 0, 3], table, [3, -1, 2], [1, 1, 1], conv, ssm, x, bb,
                       aa, family)
    assert md.token_order is not None
    want = ([ref.token(0, x[t], bb[t], aa[t]) for t in range(4)]
            + [ref.token(1, x[t], bb[t], aa[t]) for t in range(4, 6)]
            + [ref.token(2, x[t], bb[t], aa[t]) for t in range(6, 9)])
    torch.testing.assert_close(out, torch.stack(want).to(out.dtype), rtol=1e-9, atol=1e-9)


# --- the op table ---------------------------------------------------------------------------

def test_op_table_follows_the_documentation():
    from vllm_ascend_ext.attention.gdn import ops_table as t

    a2 = t.gdn_ops_for("A2", num_spec=3, state_dtype="bfloat16")
    assert (a2.decode, a2.prefill, a2.conv, a2.why) == (t.RECURRENT, t.CHUNK, t.OWN_CONV, "")
    assert t.gdn_ops_for("A3").torch_npu_recurrence
    a5 = t.gdn_ops_for("A5")
    assert a5.decode == a5.prefill == t.OWN_RECURRENT and "A5" in a5.why
    # fp32 states (Qwen3.5's mamba_ssm_dtype) where the documented bf16 binds: own ops
    f32 = t.gdn_ops_for("A2", state_dtype="float32")
    assert not f32.torch_npu_recurrence and "bfloat16" in f32.why
    # verify rows longer than the op's 8 tokens: own recurrence for decode, chunk op stays
    long = t.gdn_ops_for("A3", num_spec=8)
    assert long.decode == t.OWN_RECURRENT and long.prefill == t.CHUNK and "8 tokens" in long.why
    assert t.gdn_ops_for("A3", num_spec=7).decode == t.RECURRENT


def test_torch_npus_gdn_ops_only_for_the_head_shapes_they_document():
    """npu_chunk_gated_delta_rule documents N_k, N_v <= 64, D_k = D_v = 128 and N_v a
    multiple of N_k; npu_recurrent_gated_delta_rule N, D <= 256 (torch-npu 2.13). A rank
    outside them takes the plugin's own op, with the reason (the contract rules name the
    same lines)."""
    from vllm_ascend_ext.attention.gdn import ops_table as t

    def ops(nk, nv, dk, dv):
        return t.gdn_ops_for("A2", state_dtype="bfloat16", shape=t.HeadShape(nk, nv, dk, dv))

    # Qwen3-Next-80B at TP 4: 16/4 key heads, 32/4 value heads, 128-wide heads
    qwen3_next_tp4 = ops(4, 8, 128, 128)
    assert (qwen3_next_tp4.decode, qwen3_next_tp4.prefill, qwen3_next_tp4.why) == (
        t.RECURRENT, t.CHUNK, "")
    small = ops(2, 4, 64, 64)                # the embedded tiny model's 64-wide heads
    assert small.decode == t.RECURRENT and small.prefill == t.OWN_RECURRENT
    assert "Dk=64, Dv=64" in small.why and t.CHUNK in small.why
    crowded = ops(2, 80, 128, 128)
    assert crowded.prefill == t.OWN_RECURRENT and "Nv=80" in crowded.why
    assert ops(3, 4, 128, 128).prefill == t.OWN_RECURRENT         # Nv not a multiple
    wide = ops(2, 4, 128, 512)
    assert wide.decode == wide.prefill == t.OWN_RECURRENT and "Dv=512" in wide.why
    assert ops(2, 4, 128, 128).why == ""
    # plain emulation (no binding dtype): the references take any shape
    assert t.gdn_ops_for("A2", shape=t.HeadShape(2, 4, 64, 64)).prefill == t.CHUNK


def test_vllm_cpu_weight_dispatch_leaves_a_flagged_conv_weight_as_taps():
    """The GDN layer marks its conv1d with vLLM's ``_cpu_skip_gemm_dispatch`` (as vLLM's
    MLA marks kv_b_proj): vLLM's CPU linear method then keeps the [dim, 1, K] taps. Unmarked
    bf16 width-4 taps are repacked in place on CPUs with AVX-512 BF16 (the plugin's conv op
    read them as garbage: every bf16 token wrong)."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("vLLM's CPU weight dispatch only")
    taps = torch.randn(64, 1, 4).to(torch.bfloat16)

    def conv(flag: bool) -> torch.nn.Module:
        m = torch.nn.Module()
        m.weight = torch.nn.Parameter(taps.clone(), requires_grad=False)
        if flag:
            m._cpu_skip_gemm_dispatch = True
        UnquantizedLinearMethod().process_weights_after_loading(m)
        return m

    assert torch.equal(conv(True).weight, taps)
    if torch.cpu._is_avx512_bf16_supported():
        unflagged = conv(False)
        assert not (unflagged.weight.shape == taps.shape and torch.equal(unflagged.weight, taps))
