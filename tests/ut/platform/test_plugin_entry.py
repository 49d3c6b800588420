"""Entry points and backend selection, without starting an engine."""

from __future__ import annotations

import logging

import pytest
import torch
from vllm.v1.attention.selector import AttentionSelectorConfig

import vllm_ascend_ext
from vllm_ascend_ext.errors import AscendExtError
from vllm_ascend_ext.platform import probe
from vllm_ascend_ext.platform.selection import (
    FIA_BACKEND_PATH,
    UnsupportedAttentionError,
    preflight,
    select_attention_backend,
)
from vllm_ascend_ext.platform.soc import from_name


def test_no_npu_and_no_emulation_means_inactive(monkeypatch):
    monkeypatch.delenv("ASCEND_EXT_EMULATE", raising=False)
    monkeypatch.setattr(probe, "npu_present", lambda: False)  # holds on an NPU host too
    assert vllm_ascend_ext.platform_plugin() is None


def test_an_npu_without_emulation_selects_the_npu_platform(monkeypatch):
    monkeypatch.delenv("ASCEND_EXT_EMULATE", raising=False)
    monkeypatch.setattr(probe, "npu_present", lambda: True)
    assert vllm_ascend_ext.platform_plugin() == "vllm_ascend_ext.platform.npu.AscendNPUPlatform"


def test_npu_present_is_false_without_device_nodes_or_torch_npu(monkeypatch):
    monkeypatch.setattr(probe, "npu_device_nodes", lambda: [])
    assert probe.npu_present() is False
    monkeypatch.setattr(probe, "npu_device_nodes", lambda: ["/dev/davinci0"])
    monkeypatch.setattr(probe, "torch_npu_installed", lambda: False)
    assert probe.npu_present() is False


def test_register_is_a_no_op_when_inactive(monkeypatch):
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    monkeypatch.delenv("ASCEND_EXT_EMULATE", raising=False)
    monkeypatch.setattr(probe, "npu_present", lambda: False)
    from vllm import ModelRegistry
    from vllm.model_executor.layers import quantization as q

    before = list(AttentionBackendEnum.__members__)
    had_method = "ascend_ext" in q.QUANTIZATION_METHODS
    vllm_ascend_ext.register()
    assert list(AttentionBackendEnum.__members__) == before
    assert ("ascend_ext" in q.QUANTIZATION_METHODS) == had_method
    if not had_method:
        assert "AscendDeepseekV32" not in str(ModelRegistry.models.get("DeepseekV32ForCausalLM"))


def test_register_when_active_adds_backends_quantization_and_dsa_models(monkeypatch):
    from vllm import ModelRegistry
    from vllm.model_executor.layers import quantization as q
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    monkeypatch.setenv("ASCEND_EXT_EMULATE", "1")
    vllm_ascend_ext.register()
    vllm_ascend_ext.register()                      # idempotent
    assert {"ASCEND_EXT_FIA", "ASCEND_EXT_SFA"} <= set(AttentionBackendEnum.__members__)
    assert q.get_quantization_config("ascend_ext").__name__ == "AscendExtQuantConfig"
    for arch in ("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM"):
        assert "AscendDeepseekV32ForCausalLM" in str(ModelRegistry.models[arch])


@pytest.mark.parametrize("value", ["1", "true", "ON"])
def test_emulation_selects_the_emulated_platform(monkeypatch, value):
    monkeypatch.setenv("ASCEND_EXT_EMULATE", value)
    assert vllm_ascend_ext.platform_plugin() == vllm_ascend_ext.EMULATED_PLATFORM


def test_bad_emulate_value_is_an_error(monkeypatch):
    monkeypatch.setenv("ASCEND_EXT_EMULATE", "maybe")
    with pytest.raises(AscendExtError, match="ASCEND_EXT_EMULATE='maybe'") as info:
        vllm_ascend_ext.platform_plugin()
    # Not a ValueError: vLLM's pydantic configs would wrap it into a long ValidationError.
    assert not isinstance(info.value, (ValueError, AssertionError))


def test_coexistence_names_the_vllm_plugins_setting(monkeypatch, caplog):
    monkeypatch.setenv("ASCEND_EXT_EMULATE", "1")
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    monkeypatch.setattr(probe, "other_platform_plugins", lambda own: ["ascend"])
    logger = logging.getLogger("vllm.ascend_ext")
    monkeypatch.setattr(logger, "propagate", True)
    with caplog.at_level(logging.WARNING, logger="vllm.ascend_ext"):
        vllm_ascend_ext.platform_plugin()
    assert "VLLM_PLUGINS=ascend_ext" in caplog.text and "ascend" in caplog.text


def _sel(**kw):
    base = dict(head_size=64, dtype=torch.float32, kv_cache_dtype="auto", block_size=128)
    base.update(kw)
    return AttentionSelectorConfig(**base)


def test_standard_decoder_attention_gets_the_fia_backend():
    assert select_attention_backend("t", from_name("a2"), _sel()) == FIA_BACKEND_PATH


@pytest.mark.parametrize("kw,needle", [
    (dict(has_sliding_window=True), "sliding window not supported"),
    (dict(has_sink=True), "attention sinks not supported"),
    (dict(kv_cache_dtype="fp8"), "kv_cache_dtype not supported"),
    (dict(attn_type="encoder_decoder"), "attention type encoder_decoder not supported"),
    (dict(use_non_causal=True), "non-causal attention not supported"),
    (dict(use_dcp=True), "DCP not supported"),
    (dict(use_pcp=True), "PCP not supported"),
    (dict(head_size=96), "head_size not supported"),
    (dict(block_size=8), "block_size not supported"),
    (dict(use_mla=True), "dense MLA"),
    (dict(use_sparse=True), "dense MLA"),
    (dict(use_mla=True, use_sparse=True, block_size=8), "ASCEND_EXT_SFA cannot serve.*block_size"),
    (dict(use_mla=True, use_sparse=True, block_size=128, kv_cache_dtype="fp8"),
     "ASCEND_EXT_SFA cannot serve.*kv_cache_dtype"),
    (dict(use_mla=True, use_sparse=True, block_size=128, has_sink=True), "sinks"),
])
def test_unsupported_features_are_refused_at_selection(kw, needle):
    with pytest.raises(UnsupportedAttentionError, match=needle):
        select_attention_backend("t", from_name("a2"), _sel(**kw))


def test_sparse_mla_gets_the_sfa_backend():
    from vllm_ascend_ext.platform.selection import SFA_BACKEND_PATH

    assert select_attention_backend(
        "t", from_name("a3"), _sel(head_size=512, use_mla=True, use_sparse=True)
    ) == SFA_BACKEND_PATH


def test_emulated_soc_comes_from_the_environment(monkeypatch):
    from vllm_ascend_ext.emulation.platform import EmulatedAscendPlatform

    monkeypatch.delenv("ASCEND_EXT_SOC", raising=False)
    assert EmulatedAscendPlatform.soc().family == "A2"
    monkeypatch.setenv("ASCEND_EXT_SOC", "ascend950")
    assert EmulatedAscendPlatform.soc().name == "ascend950"
    monkeypatch.setenv("ASCEND_EXT_SOC", "ascend999")
    with pytest.raises(AscendExtError, match="^ASCEND_EXT_SOC='ascend999': unknown Ascend SoC"):
        EmulatedAscendPlatform.soc()
    monkeypatch.setenv("ASCEND_EXT_SOC", "ascend310p3")  # known chip, unsupported family
    with pytest.raises(AscendExtError, match="^ASCEND_EXT_SOC='ascend310p3': SoC ascend310p3 \\(310P\\) is not supported"):
        EmulatedAscendPlatform.soc()


def test_batch_invariance_is_accepted_because_mixed_steps_then_always_split():
    assert select_attention_backend("t", from_name("a2"), _sel(use_batch_invariant=True)) \
        == FIA_BACKEND_PATH


def _vllm_config(use_mla=False, index_topk=None, head_size=64, cache_dtype="auto",
                 block_size=128, user_block=False, pcp=1, wrapped=False, heads=(16, 2), tp=1):
    from types import SimpleNamespace

    text = SimpleNamespace(**({"index_topk": index_topk} if index_topk else {}))
    # A multimodal-style wrapper nests the text model's config (vLLM: hf_text_config).
    hf = SimpleNamespace(text_config=text) if wrapped else text
    model = SimpleNamespace(get_head_size=lambda: head_size, dtype=torch.bfloat16,
                            use_mla=use_mla, hf_config=hf, hf_text_config=text,
                            is_attention_free=False,
                            get_num_attention_heads=lambda p: heads[0] // p.tensor_parallel_size,
                            get_num_kv_heads=lambda p: max(1, heads[1] // p.tensor_parallel_size),
                            get_total_num_kv_heads=lambda: heads[1])
    return SimpleNamespace(
        model_config=model,
        cache_config=SimpleNamespace(cache_dtype=cache_dtype, block_size=block_size,
                                     user_specified_block_size=user_block),
        kv_transfer_config=None,
        parallel_config=SimpleNamespace(prefill_context_parallel_size=pcp,
                                        decode_context_parallel_size=1, tensor_parallel_size=tp),
        attention_config=SimpleNamespace(use_non_causal=False),
    )


@pytest.mark.parametrize("kwargs,needle", [
    (dict(use_mla=True, head_size=576), "dense MLA"),
    (dict(cache_dtype="fp8"), "kv_cache_dtype not supported"),
    (dict(head_size=80), "head_size not supported"),
    (dict(block_size=24, user_block=True), "block_size not supported"),
    (dict(pcp=2), "PCP not supported"),
])
def test_preflight_refuses_the_model_before_the_engine_starts(kwargs, needle):
    with pytest.raises(UnsupportedAttentionError, match=needle) as info:
        preflight("t", from_name("a2"), _vllm_config(**kwargs))
    served = ("served are standard decoder attention" if kwargs.get("use_mla") else
              "--block-size multiples of 128 up to 512 (larger blocks are split into kernel "
              "blocks); --kv-cache-dtype auto, float16, bfloat16")
    assert served in str(info.value)  # what would be served instead


def test_preflight_refuses_head_size_256_where_a_rank_keeps_as_many_kv_as_query_heads():
    # Qwen3-Next's full attention: 16 query / 2 KV heads of 256. GQA on every rank up to
    # TP 8 (2 query heads, 1 KV head); at TP 16 each rank has one of each (MHA)
    for tp in (1, 2, 8):
        preflight("t", from_name("a2"), _vllm_config(head_size=256, tp=tp))
    with pytest.raises(UnsupportedAttentionError, match=r"head size 256 with as many KV heads "
                       r"as query heads \(1\) per rank.*2 KV heads, 1 query and 1 KV heads per "
                       r"rank at --tensor-parallel-size 16"):
        preflight("t", from_name("a2"), _vllm_config(head_size=256, tp=16))
    with pytest.raises(UnsupportedAttentionError, match="as many KV heads as query heads .8."):
        preflight("t", from_name("a2"), _vllm_config(head_size=256, heads=(8, 8)))
    preflight("t", from_name("a2"), _vllm_config(head_size=128, heads=(8, 8)))   # MHA at 128


def test_preflight_passes_what_the_backends_serve():
    preflight("t", from_name("a2"), _vllm_config())
    preflight("t", from_name("a2"), _vllm_config(use_mla=True, index_topk=2048, head_size=576))
    preflight("t", from_name("a2"), _vllm_config(block_size=24, user_block=False))  # not the user's
    preflight("t", from_name("a2"), _vllm_config(use_mla=True, index_topk=2048, head_size=576,
                                                 wrapped=True))
