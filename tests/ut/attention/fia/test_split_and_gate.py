"""Mixed-step split: boundary, spans, the gate, and split == single == dense."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.ut.dense import dense_attention, write_paged
from vllm_ascend_ext.attention.fia.gate import LayerTraits, decide
from vllm_ascend_ext.attention.fia.plan import BatchMetadataError
from vllm_ascend_ext.attention.fia.split import (
    Boundary,
    check_against_vllm,
    find_boundary,
    spans,
)
from vllm_ascend_ext.ops.fia import causal_mask_2048, npu_fused_infer_attention_score


def test_boundary_of_a_decode_first_batch_with_spec_decodes_and_padding():
    # decodes of 1 and 4 tokens (threshold 4), a 9-token chunk, a short first chunk, padding
    cu = list(itertools.accumulate([1, 4, 1, 9, 3, 0]))
    b = find_boundary(cu, 4)
    assert b == Boundary(num_decodes=3, num_decode_tokens=6, num_prefills=2, num_prefill_tokens=12)
    dec, pre = spans(cu, [10, 20, 30, 40, 3, 0], b)
    assert (dec.tok0, dec.tok1, dec.req0, dec.req1) == (0, 6, 0, 3)
    assert dec.actual_seq_lengths_q == (1, 5, 6) and dec.actual_seq_lengths_kv == (10, 20, 30)
    assert (pre.tok0, pre.tok1, pre.req0, pre.req1) == (6, 18, 3, 6)
    assert pre.actual_seq_lengths_q == (9, 12, 12)  # rebased to start at 0
    assert pre.actual_seq_lengths_kv == (40, 3, 0)


def test_padding_before_real_requests_fails_loudly():
    with pytest.raises(BatchMetadataError, match="zero-length request 1 precedes"):
        find_boundary([1, 1, 5], 1)


@pytest.mark.parametrize("vllm_counts,pad,needle", [
    ((3, 2, 5, 12), 0, "num_decodes=3, num_decode_tokens=5"),
    ((2, 2, 6, 12), 0, "num_decodes=2, num_decode_tokens=6"),
    ((3, 2, 6, 11), 0, "num_prefill_tokens=11"),
    ((3, 1, 6, 12), 0, "num_prefills=1"),
    ((3, 2, 6, 20), 4, "+4 padding tokens"),
])
def test_boundary_disagreeing_with_vllm_names_the_counts(vllm_counts, pad, needle):
    ours = Boundary(3, 6, 2, 12)
    with pytest.raises(BatchMetadataError, match=needle.replace("+", r"\+")):
        check_against_vllm(ours, vllm_counts, pad)
    check_against_vllm(ours, (3, 2, 6, 12 + pad), pad)  # padding tokens are allowed


QWEN3 = LayerTraits(head_dim=128, local_q_heads=8, local_kv_heads=1)
QWEN35_TP8 = LayerTraits(head_dim=256, local_q_heads=3, local_kv_heads=1)  # regressing family


@pytest.mark.parametrize("mode,soc,traits,inv,nd,np_,split,reason", [
    ("auto", "A5", QWEN3, False, 4, 1, True, "auto"),
    ("auto", "A2", QWEN3, False, 4, 1, False, "soc A2 not in A5"),
    ("auto", "A3", QWEN3, False, 4, 1, False, "soc A3 not in A5"),
    ("on", "A2", QWEN3, False, 4, 1, True, "mixed_split=on"),
    ("off", "A5", QWEN3, False, 4, 1, False, "mixed_split=off"),
    ("auto", "A5", QWEN35_TP8, False, 4, 1, False, "regressing shape: head_dim 256 with 3 local q heads"),
    ("auto", "A5", LayerTraits(256, 4, 1), False, 4, 1, True, "auto"),
    ("auto", "A5", LayerTraits(128, 2, 1), False, 4, 1, True, "auto"),  # d128 never regresses
    ("on", "A5", QWEN35_TP8, False, 4, 1, True, "mixed_split=on"),
    ("auto", "A5", LayerTraits(128, 6, 4), False, 4, 1, False, "GQA not divisible"),
    ("auto", "A2", QWEN3, True, 4, 1, True, "batch invariance"),  # invariance beats auto
    ("off", "A5", QWEN3, True, 4, 1, False, "mixed_split=off"),  # off beats invariance
    ("on", "A5", LayerTraits(128, 8, 1, sliding_window=True), True, 4, 1, False, "unsupported: sliding window"),
    ("on", "A5", LayerTraits(128, 8, 1, sinks=True), False, 4, 1, False, "unsupported: attention sinks"),
    ("on", "A5", LayerTraits(128, 8, 1, alibi=True), False, 4, 1, False, "unsupported: ALiBi"),
    ("on", "A5", LayerTraits(128, 8, 1, causal=False), False, 4, 1, False, "unsupported: non-causal attention"),
    ("on", "A5", LayerTraits(128, 8, 1, decoder_self_attention=False), False, 4, 1, False,
     "unsupported: not decoder self-attention"),
    ("on", "A5", QWEN3, False, 0, 2, False, "not mixed"),
    ("on", "A5", QWEN3, False, 3, 0, False, "not mixed"),
])
def test_gate_table(mode, soc, traits, inv, nd, np_, split, reason):
    d = decide(mode, soc, traits, batch_invariant=inv, num_decodes=nd, num_prefills=np_)
    assert (d.split, d.reason) == (split, reason)


def _fia(q, kc, vc, table, cu, kv, nq, nkv, d, bs):
    out, _ = npu_fused_infer_attention_score(
        q, kc.view(kc.shape[0], bs, -1), vc.view(vc.shape[0], bs, -1),
        atten_mask=causal_mask_2048(), actual_seq_lengths=list(cu), actual_seq_lengths_kv=list(kv),
        block_table=table, num_heads=nq, num_key_value_heads=nkv, scale=d**-0.5,
        input_layout="TND", sparse_mode=3, block_size=bs)
    return out


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**16), n_dec=st.integers(0, 6), spec=st.integers(1, 4),
       n_pre=st.integers(0, 3), gqa=st.sampled_from([1, 2, 4, 8]),
       d=st.sampled_from([64, 128, 256]), bs=st.sampled_from([16, 128]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_split_equals_single_equals_dense(seed, n_dec, spec, n_pre, gqa, d, bs, dtype):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    nkv = 2
    gqa = max(gqa, 2) if d == 256 else gqa   # FIA takes 256 only with GQA (fia_checks)
    nq = nkv * gqa
    # decodes (1..spec tokens each: speculative verifies), then chunks on cached prefixes
    lens = [(q, q + rng.randint(0, 200)) for q in (rng.randint(1, spec) for _ in range(n_dec))]
    lens += [(q, q + rng.randint(0, 150)) for q in (rng.randint(spec + 1, 40) for _ in range(n_pre))]
    if not lens:
        lens = [(1, 5)]
    seq_k = [torch.randn(kv, nkv, d) for _, kv in lens]
    seq_v = [torch.randn(kv, nkv, d) for _, kv in lens]
    kc, vc, table = write_paged(seq_k, seq_v, bs, sum(-(-kv // bs) for _, kv in lens) + 2, rng, dtype)
    qs = [torch.randn(q, nq, d).to(dtype) for q, _ in lens]
    query = torch.cat(qs)
    cu = list(itertools.accumulate(q for q, _ in lens))
    kv = [k for _, k in lens]
    single = _fia(query, kc, vc, table, cu, kv, nq, nkv, d, bs)
    b = find_boundary(cu, spec)
    split = torch.empty_like(single)
    for sp in spans(cu, kv, b):
        if sp.tok1 > sp.tok0:
            split[sp.tok0:sp.tok1] = _fia(query[sp.tok0:sp.tok1], kc, vc, table[sp.req0:sp.req1],
                                          sp.actual_seq_lengths_q, sp.actual_seq_lengths_kv,
                                          nq, nkv, d, bs)
    dense = torch.cat([dense_attention(q.float(), k.to(dtype).float(), v.to(dtype).float(),
                                       d**-0.5, lambda i, j, off=lkv - lq: j <= i + off)[0]
                       for q, k, v, (lq, lkv) in zip(qs, seq_k, seq_v, lens)])
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(split.float(), single.float(), atol=tol, rtol=tol)
    torch.testing.assert_close(split.float(), dense, atol=tol, rtol=tol)
