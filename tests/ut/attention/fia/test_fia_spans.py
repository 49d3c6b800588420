"""The FIA forward loops over the metadata's spans: one path for 1, 2 or more spans.

The metadata here is written by hand (no builder): the same step given as one span, as
(decode, prefill) spans, and as one span per request must each give dense attention;
spans whose token boundary is off by one give a clear error (FIA's TND rule) or, with
self-consistent host lists but rows shifted by one, a different result. The pure
``step_spans`` and the builder's spans (a decode graph step is one span) are checked too.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.kv_cache_interface import FullAttentionSpec

from tests.ut.dense import dense_attention
from vllm_ascend_ext.attention.fia import graph_tasks
from vllm_ascend_ext.attention.fia.builder import AscendFIAMetadataBuilder
from vllm_ascend_ext.attention.fia.graph_tasks import update_before_replay
from vllm_ascend_ext.attention.fia.impl import AscendFIAImpl
from vllm_ascend_ext.attention.fia.metadata import AscendFIAMetadata
from vllm_ascend_ext.attention.fia.plan import BatchMetadataError
from vllm_ascend_ext.attention.fia.split import Boundary, Span, find_boundary, spans, step_spans
from vllm_ascend_ext.attention.kv_layout import plane_block_table, plane_slots, plane_views
from vllm_ascend_ext.ops.fia_checks import FIAArgumentError

NQ, NKV, D, BS, NB = 4, 2, 64, 16, 16
Q_LENS = [1, 1, 3, 9, 5]          # two decodes, a chunk on a cached prefix, two prefills
SEQ_LENS = [20, 7, 18, 9, 37]
PAD = 2                           # runner padding rows after the real tokens
CU = tuple(itertools.accumulate(Q_LENS))
TABLE = torch.tensor([[3, 9, 1], [12, 0, 0], [5, 14, 0], [7, 0, 0], [2, 11, 6]],
                     dtype=torch.int32)


def _one_span():
    return step_spans(CU, SEQ_LENS)


def _decode_prefill():
    return step_spans(CU, SEQ_LENS, find_boundary(CU, 1))


def _per_request():
    """One span per request: nothing in the forward is specific to one or two spans."""
    starts = (0, *CU[:-1])
    return tuple(Span(t0, t1, b, b + 1, (t1 - t0,), (SEQ_LENS[b],), f"r{b}")
                 for b, (t0, t1) in enumerate(zip(starts, CU)))


def _problem(seed=0, bs=BS):
    """(query, key, value, kv_cache with each request's prefix, expected [n, NQ, D]);
    ``bs``: the cache's block size (16: requests cross blocks; 128: what an NPU's paged
    prefill takes, every request in its first block)."""
    g = torch.Generator().manual_seed(seed)
    seq_k = [torch.randn(L, NKV, D, generator=g) for L in SEQ_LENS]
    seq_v = [torch.randn(L, NKV, D, generator=g) for L in SEQ_LENS]
    kv_cache = torch.zeros(NB, NKV, bs, 2 * D)
    planes = kv_cache.view(NB, 2, bs, NKV, D)
    for b, (lq, L) in enumerate(zip(Q_LENS, SEQ_LENS)):
        for p in range(L - lq):
            planes[int(TABLE[b, p // bs]), 0, p % bs] = seq_k[b][p]
            planes[int(TABLE[b, p // bs]), 1, p % bs] = seq_v[b][p]
    qs = [torch.randn(lq, NQ, D, generator=g) for lq in Q_LENS]
    new_k = torch.cat([k[L - lq:] for k, L, lq in zip(seq_k, SEQ_LENS, Q_LENS)])
    new_v = torch.cat([v[L - lq:] for v, L, lq in zip(seq_v, SEQ_LENS, Q_LENS)])
    query = torch.cat([torch.cat(qs).view(-1, NQ * D), torch.randn(PAD, NQ * D, generator=g)])
    key = torch.cat([new_k.view(-1, NKV * D), torch.randn(PAD, NKV * D, generator=g)])
    value = torch.cat([new_v.view(-1, NKV * D), torch.randn(PAD, NKV * D, generator=g)])
    expected = torch.cat([
        dense_attention(q, k, v, D**-0.5, lambda i, j, off=L - lq: j <= i + off)[0]
        for q, k, v, lq, L in zip(qs, seq_k, seq_v, Q_LENS, SEQ_LENS)])
    return query, key, value, kv_cache, expected


def _metadata(step_spans_: tuple[Span, ...], bs: int = BS) -> AscendFIAMetadata:
    """The step's metadata, builder-free: plane ids and slots from kv_layout, given spans."""
    slots = [int(TABLE[b, p // bs]) * bs + p % bs
             for b, (lq, L) in enumerate(zip(Q_LENS, SEQ_LENS)) for p in range(L - lq, L)]
    return AscendFIAMetadata(
        num_actual_tokens=CU[-1], num_reqs=len(Q_LENS), max_query_len=max(Q_LENS),
        max_seq_len=max(SEQ_LENS), causal=True,
        block_table=plane_block_table(TABLE, 2),
        slot_indices=plane_slots(torch.tensor(slots), bs, 2),
        actual_seq_lengths_q=CU, actual_seq_lengths_kv=tuple(SEQ_LENS), spans=step_spans_)


def _forward(md, problem):
    query, key, value, kv_cache, _ = problem
    output = torch.zeros_like(query)
    AscendFIAImpl(NQ, D, D**-0.5, NKV).forward(None, query, key, value, kv_cache.clone(), md,
                                               output)
    return output


@pytest.fixture
def fia_calls(monkeypatch):
    """Every FIA call the forward issues: (tokens, host lists, block-table rows)."""
    calls = []
    real = graph_tasks.npu_fused_infer_attention_score

    def counting(query, *args, **kwargs):
        calls.append((query.shape[0], tuple(kwargs["actual_seq_lengths"]),
                      tuple(kwargs["actual_seq_lengths_kv"]), kwargs["block_table"].shape[0]))
        return real(query, *args, **kwargs)
    monkeypatch.setattr(graph_tasks, "npu_fused_infer_attention_score", counting)
    return calls


@pytest.mark.parametrize("make", [_one_span, _decode_prefill, _per_request],
                         ids=["1-span", "decode+prefill", "span-per-request"])
def test_any_number_of_spans_goes_through_the_same_path_and_equals_dense(make, fia_calls):
    problem = _problem()
    md = _metadata(make())
    out = _forward(md, problem)
    n = CU[-1]
    torch.testing.assert_close(out[:n].view(n, NQ, D), problem[4], atol=1e-5, rtol=1e-5)
    assert out[n:].abs().sum() == 0                        # padding rows are not written
    assert fia_calls == [(sp.tok1 - sp.tok0, sp.actual_seq_lengths_q, sp.actual_seq_lengths_kv,
                          sp.req1 - sp.req0) for sp in md.spans]


def test_the_split_spans_are_what_the_forward_issues(fia_calls):
    md = _metadata(_decode_prefill())
    assert [sp.name for sp in md.spans] == ["decode", "prefill"]
    _forward(md, _problem())
    assert fia_calls == [(2, (1, 2), (20, 7), 2), (17, (3, 12, 17), (18, 9, 37), 3)]


def test_no_spans_writes_the_cache_and_calls_no_fia(fia_calls):
    query, key, value, kv_cache, _ = _problem()
    md = _metadata(())
    output = torch.zeros_like(query)
    AscendFIAImpl(NQ, D, D**-0.5, NKV).forward(None, query, key, value, kv_cache, md, output)
    assert fia_calls == [] and output.abs().sum() == 0
    k_plane = kv_cache.view(NB, 2, BS, NKV, D)[int(TABLE[0, 1]), 0, (SEQ_LENS[0] - 1) % BS]
    torch.testing.assert_close(k_plane, key[0].view(NKV, D))   # K/V were still written


def test_negative_control_token_boundary_off_by_one_is_a_clear_error():
    dec, pre = _decode_prefill()
    off = (dataclasses.replace(dec, tok1=dec.tok1 + 1),    # host lists left as they were
           dataclasses.replace(pre, tok0=pre.tok0 + 1))
    with pytest.raises(FIAArgumentError, match="must equal the packed token count 3"):
        _forward(_metadata(off), _problem())


def test_negative_control_rows_shifted_by_one_give_a_different_result():
    problem = _problem()
    dec, pre = _decode_prefill()
    good = _forward(_metadata((dec, pre)), problem)
    # Self-consistent for FIA (same token count), but one row off: reads and writes the
    # neighbouring rows of the query and the output.
    shifted = (dec, dataclasses.replace(pre, tok0=pre.tok0 + 1, tok1=pre.tok1 + 1))
    bad = _forward(_metadata(shifted), problem)
    n = CU[-1]
    assert not torch.allclose(bad[:n], good[:n], atol=1e-3)
    torch.testing.assert_close(bad[:dec.tok1], good[:dec.tok1])   # the decode span is right


def test_step_spans_are_none_one_or_the_split():
    assert step_spans((), ()) == ()
    assert step_spans((0, 0), (0, 0)) == ()                  # padding requests only
    (whole,) = step_spans((1, 2, 2), (6, 18, 0))             # padding requests stay in
    assert (whole.rows, whole.reqs, whole.name) == (slice(0, 2), slice(0, 3), "single")
    assert whole.host_lists == {"actual_seq_lengths": (1, 2, 2),
                                "actual_seq_lengths_kv": (6, 18, 0)}
    b = find_boundary(CU, 1)
    assert step_spans(CU, SEQ_LENS, b) == spans(CU, SEQ_LENS, b)
    with pytest.raises(BatchMetadataError, match="a split needs decodes and prefills"):
        step_spans((1, 2), (5, 6), Boundary(2, 2, 0, 0))


def _cam(q_lens, seq_lens):
    qsl = torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32)
    table = TABLE[:len(q_lens)]
    slots = [int(table[b, p // BS]) * BS + p % BS
             for b, (lq, L) in enumerate(zip(q_lens, seq_lens)) for p in range(L - lq, L)]
    return CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32), num_reqs=len(q_lens),
        num_actual_tokens=int(qsl[-1]), max_query_len=max(q_lens), max_seq_len=max(seq_lens),
        block_table_tensor=table, slot_mapping=torch.tensor(slots, dtype=torch.int64),
        seq_lens_cpu_upper_bound=torch.tensor(seq_lens, dtype=torch.int32))


def _builder(mode):
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=NKV, head_size=D, dtype=torch.float32)
    return AscendFIAMetadataBuilder(spec, ["layer.0"], None, torch.device("cpu"), mode=mode)


@pytest.mark.parametrize("mode,names", [("on", ["decode", "prefill"]), ("off", ["single"])])
def test_the_builder_always_gives_spans_and_the_gate_decides_how_many(mode, names):
    md = _builder(mode).build(0, _cam(Q_LENS, SEQ_LENS))
    assert [sp.name for sp in md.spans] == names
    assert md.spans[-1].tok1 == md.num_actual_tokens and md.spans[-1].req1 == md.num_reqs
    problem = _problem()
    n = CU[-1]
    torch.testing.assert_close(_forward(md, problem)[:n].view(n, NQ, D), problem[4],
                               atol=1e-5, rtol=1e-5)


def test_a_decode_graph_step_is_one_span_and_a_split_step_is_refused_on_replay():
    md = _builder("on").build(0, _cam([1, 1, 1], [5, 9, 3]))
    (span,) = md.spans                                        # decode-only: never split
    assert span.host_lists == {"actual_seq_lengths": md.actual_seq_lengths_q,
                               "actual_seq_lengths_kv": md.actual_seq_lengths_kv}
    mixed = _builder("on").build(0, _cam(Q_LENS, SEQ_LENS))
    with pytest.raises(BatchMetadataError, match="a split \\(mixed\\) step was replayed"):
        update_before_replay({"layer.0": dataclasses.replace(mixed, graph_tasks=object())}, 17)


def test_a_strided_query_reaches_fia_contiguous_in_contract_mode(contract):
    """Eager, the query is a strided split of the fused QKV output (RoPE rotates it in
    place); FIA takes no strided query. Contract mode (the torch_npu call site, checked;
    bf16 as on the NPU) passes and the values are dense attention's; the strided query
    handed to FIA as it is (the span call without the forward) is refused."""
    from vllm_ascend_ext.contract.harness import ContractViolation

    harness = contract("ascend910b2")
    # block size 128: the prefill span's call is paged prefill (its documented sizes)
    query, key, value, kv_cache, expected = (t.to(torch.bfloat16) for t in _problem(bs=128))
    strided = torch.cat([query, key, value], dim=-1)[:, : NQ * D]
    assert not strided.is_contiguous()
    md = _metadata(_decode_prefill(), bs=128)
    output = torch.zeros_like(query)
    impl = AscendFIAImpl(NQ, D, D**-0.5, NKV)
    impl.forward(None, strided, key, value, kv_cache.clone(), md, output)
    n = CU[-1]
    torch.testing.assert_close(output[:n].view(n, NQ, D).float(), expected.float(),
                               atol=3e-2, rtol=3e-2)
    assert harness.calls["npu_fused_infer_attention_score"] == 2
    key_cache, value_cache, _ = plane_views(kv_cache, md.plane_factor)
    with pytest.raises(ContractViolation, match="query: non-contiguous tensor"):
        impl._fia(strided, key_cache, value_cache, md, md.spans[0])
