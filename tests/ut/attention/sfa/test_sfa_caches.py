"""SFA caches: the kernels' contiguous paged views, and the specs that put an SFA layer's
three caches into one vLLM KV-cache group."""

from __future__ import annotations

import pytest
import torch
from vllm.v1.kv_cache_interface import MLAAttentionSpec, UniformTypeKVCacheSpecs

from vllm_ascend_ext.attention.sfa.caches import SfaCacheLayoutError, paged
from vllm_ascend_ext.attention.sfa.transfer import run_with_kv_transfer


def test_paged_is_a_contiguous_view_of_the_bound_cache():
    bound = torch.arange(2 * 1 * 4 * 8, dtype=torch.float32).view(2, 1, 4, 8)  # [B, H=1, N, C]
    view = paged(bound, 8)
    assert view.shape == (2, 4, 1, 8) and view.is_contiguous()
    assert view.data_ptr() == bound.data_ptr()
    view[1, 3, 0, 7] = -1.0                                                 # same memory
    assert bound[1, 0, 3, 7] == -1.0


def test_paged_refuses_strided_views_and_wrong_widths():
    row = torch.zeros(2, 4, 8 + 4)
    with pytest.raises(SfaCacheLayoutError, match="must be contiguous"):
        paged(row[..., :8], 8)
    with pytest.raises(SfaCacheLayoutError, match=r"must be \[num_blocks, block_size, 4\]"):
        paged(torch.zeros(2, 4, 8), 4)


def test_three_widths_with_one_block_size_form_one_uniform_group():
    """What lets vLLM give the latent, rope and indexer-key caches one block table."""
    specs = {f"l.{name}": MLAAttentionSpec(block_size=128, num_kv_heads=1, head_size=width,
                                           dtype=torch.bfloat16)
             for name, width in (("attn", 512), ("attn.k_rope_cache", 64),
                                 ("attn.indexer_k_cache", 128))}
    group = UniformTypeKVCacheSpecs.from_specs(specs)
    assert group is not None
    assert group.page_size_bytes == 128 * (512 + 64 + 128) * 2   # one 704-wide row's bytes


def test_without_a_connector_the_body_just_runs():
    ran = []
    run_with_kv_transfer(["a", "b", "c"], lambda: ran.append(1))
    assert ran == [1]


def test_with_a_connector_every_cache_is_awaited_before_and_saved_after(monkeypatch):
    import vllm.distributed.kv_transfer as kvt
    import vllm.model_executor.layers.attention.attention as attention

    events = []

    class Connector:
        def has_connector_metadata(self):
            return True

        def wait_for_layer_load(self, name):
            events.append(("wait", name))

        def save_kv_layer(self, name, kv_cache, attn_metadata):
            events.append(("save", name, kv_cache, attn_metadata))

    monkeypatch.setattr(kvt, "has_kv_transfer_group", lambda: True)
    monkeypatch.setattr(kvt, "is_v1_kv_transfer_group", lambda: True)
    monkeypatch.setattr(kvt, "get_kv_transfer_group", lambda: Connector())
    monkeypatch.setattr(attention, "get_attention_context",
                        lambda name: (f"md:{name}", None, f"kv:{name}", None))
    names = ["l.attn", "l.attn.k_rope_cache", "l.attn.indexer_k_cache"]
    run_with_kv_transfer(names, lambda: events.append(("body",)))
    assert events == ([("wait", n) for n in names] + [("body",)]
                      + [("save", n, f"kv:{n}", f"md:{n}") for n in names])


def test_both_platforms_accept_several_cache_layers_per_layer_index():
    from vllm_ascend_ext.emulation.platform import EmulatedAscendPlatform
    from vllm_ascend_ext.platform.npu import AscendNPUPlatform

    AscendNPUPlatform.check_runner_kv_caches_multi_layer()
    EmulatedAscendPlatform.check_runner_kv_caches_multi_layer()
