"""NPU parity: each torch_npu operator the plugin calls against its reference.

Skipped without an Ascend NPU (and torch_npu). On an Atlas 800 this is the first
suite the nightly runs; each test prints the max abs error it measured.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from vllm_ascend_ext.ops.fia import causal_mask_2048, fia_npu, fia_reference
from vllm_ascend_ext.ops.kv_cache import reshape_and_cache_npu, reshape_and_cache_reference
from vllm_ascend_ext.platform.probe import npu_present

pytestmark = [pytest.mark.npu,
              pytest.mark.skipif(not npu_present(), reason="needs an Ascend NPU and torch_npu")]


def _npu(t: torch.Tensor) -> torch.Tensor:
    return t.to("npu")


@pytest.mark.parametrize("d,gqa,bs", [(128, 1, 128), (128, 4, 128), (64, 2, 128), (256, 8, 128)])
def test_fia_matches_reference(d, gqa, bs):
    torch.manual_seed(0)
    nkv, dtype = 2, torch.bfloat16
    nq = nkv * gqa
    q_lens, kv_lens = [1, 1, 4, 37], [100, 300, 260, 37]
    nb = sum(-(-L // bs) for L in kv_lens) + 2
    kc = torch.randn(nb, bs, nkv * d).to(dtype)
    vc = torch.randn(nb, bs, nkv * d).to(dtype)
    width = max(-(-L // bs) for L in kv_lens)
    table = torch.randperm(nb)[: len(q_lens) * width].view(len(q_lens), width).to(torch.int32)
    q = torch.randn(sum(q_lens), nq, d).to(dtype)
    kw = dict(atten_mask=causal_mask_2048(), actual_seq_lengths=list(itertools.accumulate(q_lens)),
              actual_seq_lengths_kv=kv_lens, num_heads=nq, num_key_value_heads=nkv,
              scale=d**-0.5, input_layout="TND", sparse_mode=3, block_size=bs)
    ref, _ = fia_reference(q, kc, vc, block_table=table, **kw)
    kw["atten_mask"] = _npu(kw["atten_mask"])
    got, _ = fia_npu(_npu(q), _npu(kc), _npu(vc), block_table=_npu(table), **kw)
    err = (got.cpu().float() - ref.float()).abs().max().item()
    print(f"FIA d={d} gqa={gqa} bs={bs}: max abs err {err:.3e}")
    assert err < 2e-2


def test_reshape_and_cache_matches_reference():
    torch.manual_seed(0)
    nb, bs, nkv, d, T = 8, 128, 2, 128, 50
    key, value = torch.randn(T, nkv, d).half(), torch.randn(T, nkv, d).half()
    slots = torch.randperm(nb * bs)[:T].to(torch.int32)
    kc, vc = torch.zeros(nb, bs, nkv, d).half(), torch.zeros(nb, bs, nkv, d).half()
    reshape_and_cache_reference(key=key, value=value, key_cache=kc, value_cache=vc,
                                slot_indices=slots)
    kn, vn = _npu(torch.zeros_like(kc)), _npu(torch.zeros_like(vc))
    reshape_and_cache_npu(key=_npu(key), value=_npu(value), key_cache=kn, value_cache=vn,
                          slot_indices=_npu(slots))
    err = max((kn.cpu() - kc).abs().max().item(), (vn.cpu() - vc).abs().max().item())
    print(f"_npu_reshape_and_cache: max abs err {err:.3e}")
    assert err == 0
