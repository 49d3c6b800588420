"""The embedded tiny DSA models are what their generator makes, at a realistic scale."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from vllm_ascend_ext.models import TINY_DSA, TINY_DSA_W8A8
from vllm_ascend_ext.models.make_tiny_dsa import CONFIG, main, make_weights


def test_shipped_models_match_the_generator(tmp_path):
    main(str(tmp_path))
    for shipped in (TINY_DSA, TINY_DSA_W8A8):
        fresh = tmp_path / shipped.name
        a, b = load_file(str(shipped / "model.safetensors")), load_file(str(fresh / "model.safetensors"))
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), (shipped.name, k)
        for f in ("config.json", "quant_model_description.json"):
            if (shipped / f).exists():
                assert (shipped / f).read_text() == (fresh / f).read_text()
    assert json.loads((TINY_DSA / "config.json").read_text()) == CONFIG


def test_realistic_scale_and_sparsity_that_matters():
    w = make_weights()
    assert w["model.layers.0.self_attn.q_b_proj.weight"].abs().max() > 0.1    # dummy: <= 1e-3
    assert (w["model.layers.0.self_attn.kv_a_layernorm.weight"] - 1.6).abs().mean() < 0.3
    assert CONFIG["index_topk"] <= 32 and CONFIG["index_n_heads"] >= 16      # no exact-zero ties
