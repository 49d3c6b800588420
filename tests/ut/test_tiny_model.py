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
