"""NPU parity: each torch_npu operator the plugin calls against its reference.

Skipped without an Ascend NPU (and torch_npu). On an Atlas 800 this is the first
suite the nightly runs; each test prints the max abs error it measured. The caches are
what the engine passes: vLLM's per-layer ``[num_blocks, KV_N, block_size, 2*D]`` pages
(padded or not) seen as contiguous K and V plane runs addressed by plane ids
(``attention/kv_layout.py``).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from vllm_ascend_ext.attention.kv_layout import plane_block_table, plane_slots, plane_views
from vllm_ascend_ext.ops.fia import causal_mask_2048, fia_npu, fia_reference
from vllm_ascend_ext.ops.kv_cache import scatter_pa_kv_cache_npu, scatter_pa_kv_cache_reference
from vllm_ascend_ext.platform.probe import npu_present

pytestmark = [pytest.mark.npu,
              pytest.mark.skipif(not npu_present(), reason="needs an Ascend NPU and torch_npu")]


def _npu(t: torch.Tensor) -> torch.Tensor:
    return t.to("npu")


def _engine_cache(nb, nkv, bs, d, dtype, pad_planes=0):
    """A per-layer cache as vLLM allocates it (pages padded by ``pad_planes`` planes)."""
    plane = bs * nkv * d
    raw = torch.randn(nb * (2 + pad_planes) * plane).to(dtype)
    return raw.as_strided((nb, nkv, bs, 2 * d), ((2 + pad_planes) * plane, bs * 2 * d, 2 * d, 1))


@pytest.mark.parametrize("d,gqa,bs,pad", [(128, 1, 128, 0), (128, 4, 128, 0), (64, 2, 128, 0),
                                          (256, 8, 128, 0), (128, 2, 128, 1)])
def test_fia_matches_reference(d, gqa, bs, pad):
    torch.manual_seed(0)
    nkv, dtype = 2, torch.bfloat16
    nq = nkv * gqa
    q_lens, kv_lens = [1, 1, 4, 37], [100, 300, 260, 37]
    width = max(-(-L // bs) for L in kv_lens)
    nb = len(q_lens) * width + 2  # every table entry a distinct block, two spare
    cache = _engine_cache(nb, nkv, bs, d, dtype, pad)
    blocks = torch.randperm(nb)[: len(q_lens) * width].view(len(q_lens), width)
    q = torch.randn(sum(q_lens), nq, d).to(dtype)
    kw = dict(atten_mask=causal_mask_2048(), actual_seq_lengths=list(itertools.accumulate(q_lens)),
              actual_seq_lengths_kv=kv_lens, num_heads=nq, num_key_value_heads=nkv,
              scale=d**-0.5, input_layout="TND", sparse_mode=3, block_size=bs)
    kc, vc, factor = plane_views(cache)
    table = plane_block_table(blocks, factor)
    ref, _ = fia_reference(q, kc.flatten(2), vc.flatten(2), block_table=table, **kw)
    kn, vn, _ = plane_views(_npu(cache))
    kw["atten_mask"] = _npu(kw["atten_mask"])
    got, _ = fia_npu(_npu(q), kn.flatten(2), vn.flatten(2), block_table=_npu(table), **kw)
    err = (got.cpu().float() - ref.float()).abs().max().item()
    print(f"FIA d={d} gqa={gqa} bs={bs}: max abs err {err:.3e}")
    assert err < 2e-2


def test_scatter_pa_kv_cache_matches_reference():
    torch.manual_seed(0)
    nb, bs, nkv, d, T = 8, 128, 2, 128, 50
    key, value = torch.randn(T, nkv, d).half(), torch.randn(T, nkv, d).half()
    cache = torch.zeros(nb, nkv, bs, 2 * d).half()  # the engine's per-layer page layout
    on_npu = _npu(cache)
    kc, vc, factor = plane_views(cache)
    slots = plane_slots(torch.randperm(nb * bs)[:T], bs, factor)
    scatter_pa_kv_cache_reference(key, value, kc, vc, slots, cache_mode="Norm")
    kn, vn, _ = plane_views(on_npu)
    scatter_pa_kv_cache_npu(_npu(key), _npu(value), kn, vn, _npu(slots), cache_mode="Norm")
    err = (on_npu.cpu() - cache).abs().max().item()
    print(f"npu_scatter_pa_kv_cache (Norm): max abs err {err:.3e}")
    assert err == 0
