"""The backend's per-step path (builder + forward) on ``meta`` device tensors.

Meta tensors have no data: any host read of device data (``.item()``,
``.tolist()``, ``.cpu()``, a Python branch on a tensor value) raises. Host copies
(``*_cpu``) stay on the CPU, as in vLLM. A second run on CPU tensors checks the
same path computes real attention.
"""

from __future__ import annotations

import pytest
import torch
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.kv_cache_interface import FullAttentionSpec

from tests.ut.dense import dense_attention
from vllm_ascend_ext.attention.fia.builder import AscendFIAMetadataBuilder
from vllm_ascend_ext.attention.fia.impl import AscendFIAImpl
from vllm_ascend_ext.attention.fia.plan import BatchMetadataError

NQ, NKV, D, BS, NB = 4, 2, 64, 16, 12
Q_LENS, SEQ_LENS = [1, 1, 3, 9], [20, 7, 18, 9]  # decode, decode, chunk on prefix, prefill


def _common(device, pad_tokens=0):
    qsl = torch.tensor([0] + list(torch.tensor(Q_LENS).cumsum(0)), dtype=torch.int32)
    n = int(qsl[-1])
    table = torch.arange(NB, dtype=torch.int32).view(len(Q_LENS), NB // len(Q_LENS))
    slots = []
    for b, (lq, lkv) in enumerate(zip(Q_LENS, SEQ_LENS)):
        for p in range(lkv - lq, lkv):
            slots.append(int(table[b, p // BS]) * BS + p % BS)
    slots += [-1] * pad_tokens
    return CommonAttentionMetadata(
        query_start_loc=qsl.to(device), query_start_loc_cpu=qsl,
        seq_lens=torch.tensor(SEQ_LENS, dtype=torch.int32).to(device),
        num_reqs=len(Q_LENS), num_actual_tokens=n + pad_tokens, max_query_len=max(Q_LENS),
        max_seq_len=max(SEQ_LENS), block_table_tensor=table.to(device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64).to(device),
        seq_lens_cpu_upper_bound=torch.tensor(SEQ_LENS, dtype=torch.int32),
    )


def _builder(device, mode="off"):
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=NKV, head_size=D, dtype=torch.float32)
    return AscendFIAMetadataBuilder(spec, ["layer.0"], None, torch.device(device), mode=mode)


def _step(device, query, key, value, kv_cache, pad_tokens=0, mode="off"):
    md = _builder(device, mode).build(0, _common(device, pad_tokens))
    impl = AscendFIAImpl(NQ, D, D**-0.5, NKV)
    output = torch.zeros_like(query)
    impl.forward(None, query, key, value, kv_cache, md, output)
    return md, output


@pytest.mark.parametrize("mode", ["off", "on"])
def test_per_step_path_runs_on_meta_without_host_reads(mode):
    n = sum(Q_LENS) + 2
    md, out = _step("meta", torch.empty(n, NQ * D, device="meta"),
                    torch.empty(n, NKV * D, device="meta"), torch.empty(n, NKV * D, device="meta"),
                    torch.empty(NB, NKV, BS, 2 * D, device="meta"), pad_tokens=2, mode=mode)
    assert (len(md.spans) == 2) == (mode == "on")  # split: decode, prefill spans
    assert out.device.type == "meta"
    assert md.slot_indices.device.type == "meta" and md.slot_indices.dtype == torch.int32
    assert md.actual_seq_lengths_q == (1, 2, 5, 14)
    assert md.actual_seq_lengths_kv == tuple(SEQ_LENS)


@pytest.mark.parametrize("mode", ["off", "on"])
def test_same_path_on_cpu_computes_attention_and_fills_the_cache(mode):
    torch.manual_seed(0)
    seq_k = [torch.randn(L, NKV, D) for L in SEQ_LENS]
    seq_v = [torch.randn(L, NKV, D) for L in SEQ_LENS]
    kv_cache = torch.zeros(NB, NKV, BS, 2 * D)
    planes = kv_cache.view(NB, 2, BS, NKV, D)
    table = _common("cpu").block_table_tensor
    for b, L in enumerate(SEQ_LENS):  # the cached prefix (everything before the new tokens)
        for p in range(L - Q_LENS[b]):
            planes[int(table[b, p // BS]), 0, p % BS] = seq_k[b][p]
            planes[int(table[b, p // BS]), 1, p % BS] = seq_v[b][p]
    qs = [torch.randn(lq, NQ, D) for lq in Q_LENS]
    new_k = torch.cat([k[L - lq:] for k, L, lq in zip(seq_k, SEQ_LENS, Q_LENS)])
    new_v = torch.cat([v[L - lq:] for v, L, lq in zip(seq_v, SEQ_LENS, Q_LENS)])
    pad = 3  # runner padding after the real tokens
    query = torch.cat([torch.cat(qs).view(-1, NQ * D), torch.randn(pad, NQ * D)])
    key = torch.cat([new_k.view(-1, NKV * D), torch.randn(pad, NKV * D)])
    value = torch.cat([new_v.view(-1, NKV * D), torch.randn(pad, NKV * D)])
    md, out = _step("cpu", query, key, value, kv_cache, pad_tokens=pad, mode=mode)
    assert (len(md.spans) == 2) == (mode == "on")  # split: decode, prefill spans
    exp = []
    for b, (lq, L) in enumerate(zip(Q_LENS, SEQ_LENS)):
        o, _ = dense_attention(qs[b], seq_k[b], seq_v[b], D**-0.5,
                               lambda i, j, off=L - lq: j <= i + off)
        exp.append(o)
    n = sum(Q_LENS)
    torch.testing.assert_close(out[:n].view(n, NQ, D), torch.cat(exp), atol=1e-5, rtol=1e-5)


def test_builder_refuses_missing_host_seq_lens():
    cam = _common("cpu")
    cam.seq_lens_cpu_upper_bound = None
    with pytest.raises(BatchMetadataError, match="seq_lens_cpu_upper_bound"):
        _builder("cpu").build(0, cam)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(sliding_window=128), "sliding_window"),
    (dict(alibi_slopes=[0.1] * NQ), "alibi_slopes"),
    (dict(logits_soft_cap=30.0), "logits_soft_cap"),
    (dict(attn_type="encoder_only"), "attn_type"),
    (dict(kv_cache_dtype="fp8"), "kv_cache_dtype"),
])
def test_impl_refuses_what_it_cannot_compute(kwargs, needle):
    with pytest.raises(NotImplementedError, match=needle):
        AscendFIAImpl(NQ, D, D**-0.5, NKV, **kwargs)


@pytest.mark.parametrize("mode,ranges", [
    ("on", ["ascend_ext.fia_mixed.decode", "ascend_ext.fia_mixed.prefill"]),
    ("off", ["ascend_ext.fia_mixed.single"]),
])
def test_profiler_ranges_name_the_calls(mode, ranges):
    from torch.profiler import profile

    n = sum(Q_LENS)
    with profile() as prof:
        _step("cpu", torch.randn(n, NQ * D), torch.randn(n, NKV * D), torch.randn(n, NKV * D),
              torch.zeros(NB, NKV, BS, 2 * D), mode=mode)
    names = [e.name for e in prof.events() if e.name.startswith("ascend_ext.")]
    assert names == ranges
