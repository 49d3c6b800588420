"""The embedded tiny model is what its generator makes, at a realistic scale."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from vllm_ascend_ext.models import TINY_QWEN3
from vllm_ascend_ext.models.make_tiny_qwen3 import CONFIG, make_weights


def test_shipped_weights_and_config_match_the_generator():
    shipped = load_file(str(TINY_QWEN3 / "model.safetensors"))
    fresh = make_weights()
    assert shipped.keys() == fresh.keys()
    for name, tensor in fresh.items():
        assert torch.equal(shipped[name], tensor), name
    assert json.loads((TINY_QWEN3 / "config.json").read_text()) == CONFIG


def test_weights_have_a_realistic_scale_not_dummy_scale():
    w = make_weights()
    assert w["model.embed_tokens.weight"].std() > 0.5
    assert w["model.layers.0.self_attn.k_proj.weight"].abs().max() > 0.1  # dummy: <= 1e-3
    assert (w["model.layers.0.self_attn.k_norm.weight"] - 1.6).abs().mean() < 0.3


def test_shipped_tokenizer_matches_the_generator_and_has_a_chat_template(tmp_path):
    from vllm_ascend_ext.models.make_tiny_qwen3 import CHAT_TEMPLATE, make_tokenizer

    make_tokenizer(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / name).read_bytes() == (TINY_QWEN3 / name).read_bytes(), name
    assert json.loads((TINY_QWEN3 / "tokenizer_config.json").read_text())["chat_template"] \
        == CHAT_TEMPLATE


def test_shipped_qwen_moe_matches_its_generator_and_routes_non_trivially():
    from vllm_ascend_ext.models import TINY_QWEN_MOE
    from vllm_ascend_ext.models import make_tiny_qwen_moe as gen

    shipped = load_file(str(TINY_QWEN_MOE / "model.safetensors"))
    fresh = gen.make_weights()
    assert shipped.keys() == fresh.keys()
    assert all(torch.equal(shipped[k], v) for k, v in fresh.items())
    assert json.loads((TINY_QWEN_MOE / "config.json").read_text()) == gen.CONFIG
    # Router logits of embedded tokens spread over units: top-2 choices differ by token.
    logits = fresh["model.embed_tokens.weight"][:64] @ fresh["model.layers.0.mlp.gate.weight"].T
    assert logits.std() > 1.0
    assert len({tuple(sorted(r)) for r in logits.topk(2).indices.tolist()}) > 8
