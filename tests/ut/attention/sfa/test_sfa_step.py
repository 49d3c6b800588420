"""SFA per-step path: builder (slots once per step), indexer stages, meta-device run."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from vllm.v1.attention.backend import CommonAttentionMetadata

from vllm_ascend_ext.attention.sfa import indexer
from vllm_ascend_ext.attention.sfa.builder import (
    AscendSFAMetadataBuilder,
    SfaBatchError,
    half_duplicated,
    step_kind,
)
from vllm_ascend_ext.attention.sfa.caches import SfaCaches
from vllm_ascend_ext.attention.sfa.impl import AscendSFAImpl
from vllm_ascend_ext.attention.sfa.projections import SfaProjections
from vllm_ascend_ext.attention.sfa.weights import prepare
from vllm_ascend_ext.ops.counting import OpCounter
from vllm_ascend_ext.ops.format import ACL_FORMAT_FRACTAL_NZ, npu_format

H, N, DN, DR, DV, QL, KL, NI, DI, TOPK = 32, 4, 16, 8, 16, 24, 32, 4, 16, 4
BS, NB = 16, 8
Q_LENS, SEQ_LENS = [1, 1, 5, 9], [20, 7, 18, 9]
SPEC = indexer.IndexerSpec(n_heads=NI, head_dim=DI, topk=TOPK, neox=True, k_norm_eps=1e-5)


class Lin(nn.Module):
    """vLLM-linear calling convention: returns (out, bias)."""

    def __init__(self, i, o, device):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(o, i, device=device) / math.sqrt(i) if device != "meta"
                                   else torch.empty(o, i, device=device), requires_grad=False)

    def forward(self, x):
        return F.linear(x, self.weight), None


def _proj(device) -> SfaProjections:
    torch.manual_seed(0)
    o = nn.Module()
    o.q_a_proj, o.q_b_proj = Lin(H, QL, device), Lin(QL, N * (DN + DR), device)
    o.kv_a_proj_with_mqa, o.kv_b_proj = Lin(H, KL + DR, device), Lin(KL, N * (DN + DV), device)
    o.q_a_layernorm = SimpleNamespace(weight=torch.ones(QL, device=device))
    o.kv_a_layernorm = SimpleNamespace(weight=torch.ones(KL, device=device))
    ix = nn.Module()
    ix.wq_b, ix.wk_weights_proj = Lin(QL, NI * DI, device), Lin(H, DI + NI, device)
    ix.k_norm = nn.LayerNorm(DI, device=device)
    o.indexer = ix
    return SfaProjections.of(o)


def _weights(proj, route, dispose_fallback=False):
    return prepare(proj, heads=N, nope_dim=DN, v_dim=DV, route=route,
                   dispose_fallback=dispose_fallback)


def _caches(device, zeros=torch.zeros):
    """Three separate contiguous paged caches, as the engine binds them."""
    return SfaCaches(*(zeros(NB, BS, 1, d, device=device) for d in (KL, DR, DI)))


def _cam(device, slot_dtype=torch.int64):
    qsl = torch.tensor([0] + list(torch.tensor(Q_LENS).cumsum(0)), dtype=torch.int32)
    table = torch.arange(NB, dtype=torch.int32).view(len(Q_LENS), NB // len(Q_LENS))
    slots, pos = [], []
    for b, (lq, lkv) in enumerate(zip(Q_LENS, SEQ_LENS)):
        for p in range(lkv - lq, lkv):
            slots.append(int(table[b, p // BS]) * BS + p % BS)
            pos.append(p)
    return CommonAttentionMetadata(
        query_start_loc=qsl.to(device), query_start_loc_cpu=qsl,
        seq_lens=torch.tensor(SEQ_LENS, dtype=torch.int32).to(device),
        num_reqs=len(Q_LENS), num_actual_tokens=len(slots) + 2, max_query_len=max(Q_LENS),
        max_seq_len=max(SEQ_LENS), block_table_tensor=table.to(device),
        slot_mapping=torch.tensor(slots + [-1, -1], dtype=slot_dtype).to(device),
        positions=torch.tensor(pos + [0, 0]).to(device),
        seq_lens_cpu_upper_bound=torch.tensor(SEQ_LENS, dtype=torch.int32),
    )


def _builder(device):
    cache = torch.randn(64, DR) if device != "meta" else torch.empty(64, DR, device="meta")
    return AscendSFAMetadataBuilder(SimpleNamespace(block_size=BS), ["l0"], None,
                                    torch.device(device), rope_cos_sin=cache.to(device))


def _impl():
    return AscendSFAImpl(num_heads=N, qk_nope_head_dim=DN, qk_rope_head_dim=DR, v_head_dim=DV,
                         scale=(DN + DR) ** -0.5, indexer_spec=SPEC, rms_eps=1e-6)


def test_step_kind_and_half_duplicated_cos_sin():
    assert step_kind([1, 1]) == "decode" and step_kind([4, 9]) == "prefill"
    assert step_kind([1, 7]) == "mixed"
    cos, sin = half_duplicated(torch.tensor([[1.0, 2.0, 3.0, 4.0]]))
    assert cos.tolist() == [[1.0, 2.0, 1.0, 2.0]] and sin.tolist() == [[3.0, 4.0, 3.0, 4.0]]


@pytest.mark.parametrize("slot_dtype,casts", [(torch.int64, 0), (torch.int32, 1)])
def test_builder_derives_int64_slots_once_and_drops_padding(slot_dtype, casts):
    with OpCounter() as c:
        md = _builder("cpu").build(0, _cam("cpu", slot_dtype))
    assert md.slot_indices.dtype == torch.int64 and md.num_actual_tokens == sum(Q_LENS)
    assert (md.slot_indices >= 0).all()
    assert c.total()["aten._to_copy[torch.int32->torch.int64]"] == casts
    assert md.kind == "mixed" and md.cu_seqlens_q.tolist() == [1, 2, 7, 16]
    assert md.cos.shape == (sum(Q_LENS), DR)


def test_negative_slots_inside_the_step_point_at_the_null_block():
    cam = _cam("cpu")
    slots = cam.slot_mapping.clone()
    slots[2] = -1                                      # e.g. a draft token past max_model_len
    md = _builder("cpu").build(0, CommonAttentionMetadata(**{**cam.__dict__,
                                                            "slot_mapping": slots}))
    assert md.slot_indices[2] == 0 and (md.slot_indices >= 0).all()


def test_w8a8_kv_b_proj_weights_take_the_activation_dtype():
    w = prepare(_proj("cpu"), heads=N, nope_dim=DN, v_dim=DV, route="native",
                dispose_fallback=False, act_dtype=torch.bfloat16)
    assert w.w_uk.dtype == w.w_uv.dtype == torch.bfloat16


def test_builder_refuses_inconsistent_metadata():
    cam = _cam("cpu")
    bad = CommonAttentionMetadata(**{**cam.__dict__, "num_actual_tokens": 3})
    with pytest.raises(SfaBatchError, match="num_actual_tokens is 3"):
        _builder("cpu").build(0, bad)


def test_without_positions_the_builder_derives_them_from_the_kv_lengths():
    """vLLM's drafters build metadata without positions: the rope rows are then those of
    ``L - q + j`` per request, exactly what the runner's positions are (the cam's here)."""
    cam = _cam("cpu")
    b = _builder("cpu")
    want = b.build(0, cam)
    got = b.build(0, CommonAttentionMetadata(**{**cam.__dict__, "positions": None}))
    assert torch.equal(got.cos, want.cos) and torch.equal(got.sin, want.sin)
    # negative control: positions one past the end differ
    shifted = CommonAttentionMetadata(**{**cam.__dict__, "positions": cam.positions + 1})
    assert not torch.equal(b.build(0, shifted).cos, want.cos)


@pytest.mark.parametrize("route", ["native", "prolog_v3"])
def test_per_step_path_runs_on_meta_without_host_reads(route):
    proj = _proj("meta")
    md = _builder("meta").build(0, _cam("meta"))
    t = sum(Q_LENS) + 2
    out = torch.empty(t, N * DV, device="meta")
    # the reference ops read host lengths; on meta the op's meta implementation runs
    _impl().forward(proj, _weights(proj, route), torch.empty(t, H, device="meta"), out,
                    _caches("meta", torch.empty), md)
    assert out.device.type == "meta" and md.slot_indices.device.type == "meta"


def test_native_and_prolog_routes_agree_on_cpu_and_fill_the_same_cache():
    torch.manual_seed(1)
    proj = _proj("cpu")
    md = _builder("cpu").build(0, _cam("cpu"))
    x = torch.randn(sum(Q_LENS) + 2, H)
    outs, caches = [], []
    for route in ("native", "prolog_v3"):
        kv = _caches("cpu")
        out = torch.zeros(x.shape[0], N * DV)
        _impl().forward(proj, _weights(proj, route), x, out, kv, md)
        outs.append(out)
        caches.append(kv)
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
    for a, b in zip(caches[0], caches[1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        assert a.abs().sum() > 0                             # every cache was written
    assert outs[0][: sum(Q_LENS)].abs().sum() > 0


def test_dispose_fallback_frees_the_native_weights():
    proj = _proj("cpu")
    w = _weights(proj, "prolog_v3", dispose_fallback=True)
    assert w.fallback_bytes_freed == 4 * (QL * H + N * (DN + DR) * QL + (KL + DR) * H)
    assert proj.q_a_proj.weight.numel() == 0 and w.prolog.w_dq.shape == (H, QL)


def test_prolog_weights_are_cast_to_fractal_nz_once_and_others_stay_nd():
    w = _weights(_proj("cpu"), "prolog_v3")
    assert [npu_format(t) for t in (w.prolog.w_dq, w.prolog.w_uq_qr, w.prolog.w_dkv_kr)] == [
        ACL_FORMAT_FRACTAL_NZ] * 3
    assert npu_format(w.w_uk) == 2                          # weight_uk: ND (its docs)
    assert _weights(_proj("cpu"), "native").prolog is None


def test_indexer_reuses_the_gemm_tail_and_falls_back_for_other_hidden_states():
    torch.manual_seed(2)
    ix = _proj("cpu").indexer
    md = _builder("cpu").build(0, _cam("cpu"))
    t = md.num_actual_tokens
    x = torch.randn(t, H)
    q = ix.wq_b(torch.randn(t, QL))[0]
    key = torch.zeros(NB, BS, 1, DI)

    def run(x_k, x_q):
        with OpCounter() as c:
            c.watch(ix.wk_weights_proj.weight, "wk")
            tail = indexer.k_stage(SPEC, ix, x_k, md, key)
            idx = indexer.topk_stage(SPEC, ix, x_q, q, tail, md, key)
        return idx, c.total()

    same, counts = run(x, x)
    assert counts["uses[wk]"] == 1                         # one fused GEMM, tail reused
    assert counts.get("aten.contiguous", 0) == 0 and counts.get("aten.clone", 0) == 0
    copy_x = x.clone()                                     # equal values, another tensor
    other, counts2 = run(x, copy_x)
    assert counts2["uses[wk]"] == 2                        # fallback recomputes the weights part
    assert torch.equal(same, other)
    shifted, _ = run(x, x * -1.0)                          # different hidden states: result follows
    assert not torch.equal(same, shifted)
