"""The embedded tiny MiMo model (dense GQA, Qwen2 attention, one MTP layer): what its
generator makes, loadable by HF transformers' Qwen2 with only the MTP layer left over, and
peaked enough for stable greedy decoding (float32)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from vllm_ascend_ext.models import TINY_MIMO, TINY_QWEN3, tiny_mimo_path
from vllm_ascend_ext.models import make_tiny_mimo as gen

PROMPT = "the quick brown fox"
STEPS = 16


def test_shipped_weights_config_and_tokenizer_match_the_generator():
    assert tiny_mimo_path() == str(TINY_MIMO)
    shipped = load_file(str(TINY_MIMO / "model.safetensors"))
    fresh = gen.make_weights()
    assert shipped.keys() == fresh.keys()
    assert all(torch.equal(shipped[k], v) for k, v in fresh.items())
    assert json.loads((TINY_MIMO / "config.json").read_text()) == gen.CONFIG
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (TINY_MIMO / name).read_bytes() == (TINY_QWEN3 / name).read_bytes(), name


def test_config_is_dense_gqa_with_one_mtp_layer_at_a_served_head_size():
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(tiny_mimo_path())
    assert c.architectures == ["MiMoForCausalLM"] and c.num_nextn_predict_layers == 1
    # vLLM's Qwen2 attention: head_dim = hidden / heads; FIA serves 64
    assert c.hidden_size // c.num_attention_heads == 64
    assert c.num_attention_heads == 2 * c.num_key_value_heads
    mtp = [k for k in load_file(str(TINY_MIMO / "model.safetensors")) if "mtp_layers" in k]
    assert {k.split(".")[3] for k in mtp} >= {"token_layernorm", "hidden_layernorm",
                                              "input_proj", "self_attn", "mlp",
                                              "final_layernorm"}


def test_weights_have_a_realistic_scale():
    w = gen.make_weights()
    q = w["model.layers.0.self_attn.q_proj.weight"]
    assert 0.1 < q.std() < 1.0          # ~Q_SCALE / sqrt(hidden), not dummy's 1e-3
    assert w["model.layers.0.self_attn.k_proj.bias"].abs().max() > 0.05
    assert (w["model.mtp_layers.0.input_proj.weight"].shape
            == (gen.CONFIG["hidden_size"], 2 * gen.CONFIG["hidden_size"]))


@pytest.fixture(scope="module")
def hf():
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    model, info = Qwen2ForCausalLM.from_pretrained(tiny_mimo_path(), torch_dtype=torch.float32,
                                                   output_loading_info=True)
    ids = AutoTokenizer.from_pretrained(tiny_mimo_path())(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=STEPS, do_sample=False, output_scores=True,
                             return_dict_in_generate=True, eos_token_id=None, pad_token_id=0)
    return model, info, ids, out.sequences[0, ids.shape[1]:].tolist(), torch.stack(out.scores)[:, 0]


def test_hf_qwen2_loads_every_main_weight_and_leaves_only_the_mtp_layer(hf):
    _, info, *_ = hf
    assert not info["missing_keys"] and not info["mismatched_keys"]
    assert info["unexpected_keys"] and all("mtp_layers" in k for k in info["unexpected_keys"])


def test_hf_greedy_decoding_is_peaked_and_attention_matters(hf):
    model, _, ids, tokens, scores = hf
    assert len(tokens) == STEPS
    top2 = scores.topk(2, dim=-1).values
    margins = top2[:, 0] - top2[:, 1]
    # measured: min 0.013, median 1.0; fp32 engine runs differ by < 1e-5 in logprob
    assert margins.min() > 5e-3 and margins.median() > 0.5, margins
    saved = model.model.layers[1].self_attn.k_proj.weight.detach().clone()
    try:    # negative control: uniform attention in the last layer moves the logits
        with torch.no_grad():
            model.model.layers[1].self_attn.k_proj.weight.zero_()
            model.model.layers[1].self_attn.k_proj.bias.zero_()
            logits = model(torch.cat([ids, torch.tensor([tokens])], 1)).logits[0]
    finally:
        with torch.no_grad():
            model.model.layers[1].self_attn.k_proj.weight.copy_(saved)
    moved = (logits[ids.shape[1] - 1:-1] - scores).abs().amax(-1)
    assert moved.median() > 1.0, moved
