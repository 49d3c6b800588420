"""Generate the embedded tiny Qwen MoE model (Qwen2-MoE architecture): config, weights.

    python -m vllm_ascend_ext.models.make_tiny_qwen_moe [OUT_DIR] [--wide]

The routing of Qwen MoE, Qwen3-Next and Qwen3.5: softmax top-k over 8 experts,
renormalised (``norm_topk_prob``), plus a shared expert behind a sigmoid gate. Same
tokenizer and scale conventions as ``make_tiny_qwen3`` (embeddings ~N(0, 1), projections
~N(0, 1/fan_in)); router weights are scaled so that routing logits spread over a few
units and a wrong expert choice visibly changes the output. Deterministic.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from vllm_ascend_ext.models.make_tiny_qwen3 import save_model

CONFIG = {
    "architectures": ["Qwen2MoeForCausalLM"],
    "model_type": "qwen2_moe",
    "hidden_size": 128,
    "intermediate_size": 256,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 64,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "bos_token_id": 1,
    "eos_token_id": 0,
    "torch_dtype": "float32",
}


def moe_layer_weights(p: str, c: dict, lin) -> dict[str, torch.Tensor]:
    """One Qwen MoE block (router, experts, gated shared expert) under prefix ``p``;
    ``lin(out, in)`` draws a projection. Shared with the tiny Qwen3-Next generator."""
    h, moe_i, shared_i = (c["hidden_size"], c["moe_intermediate_size"],
                          c["shared_expert_intermediate_size"])
    w = {p + "mlp.gate.weight": lin(c["num_experts"], h) * 3.0}
    for e in range(c["num_experts"]):
        q = p + f"mlp.experts.{e}."
        w[q + "gate_proj.weight"] = lin(moe_i, h)
        w[q + "up_proj.weight"] = lin(moe_i, h)
        w[q + "down_proj.weight"] = lin(h, moe_i) * 2.0
    w[p + "mlp.shared_expert.gate_proj.weight"] = lin(shared_i, h)
    w[p + "mlp.shared_expert.up_proj.weight"] = lin(shared_i, h)
    w[p + "mlp.shared_expert.down_proj.weight"] = lin(h, shared_i)
    w[p + "mlp.shared_expert_gate.weight"] = lin(1, h)
    return w


# A wider variant for MC2 (expert-parallel dispatch), whose operators document hidden
# sizes of at least 1024 on Atlas A3: generated on first use into the cache
# (``models.tiny_qwen_moe_wide_path``), not shipped (34 MB).
WIDE_CONFIG = {**CONFIG, "hidden_size": 1024, "num_attention_heads": 8}


def make_weights(seed: int = 0, config: dict | None = None) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    c = config or CONFIG
    h, vocab = c["hidden_size"], c["vocab_size"]
    hd = h // c["num_attention_heads"]
    nq, nkv = c["num_attention_heads"], c["num_key_value_heads"]

    def lin(out_f: int, in_f: int) -> torch.Tensor:
        return torch.randn(out_f, in_f, generator=g) / in_f**0.5

    def gain(n: int) -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(n, generator=g)

    w = {"model.embed_tokens.weight": torch.randn(vocab, h, generator=g)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = gain(h)
        w[p + "post_attention_layernorm.weight"] = gain(h)
        for name, rows in (("q", nq * hd), ("k", nkv * hd), ("v", nkv * hd)):
            w[p + f"self_attn.{name}_proj.weight"] = lin(rows, h) * (2.0 if name != "v" else 1.0)
            w[p + f"self_attn.{name}_proj.bias"] = 0.1 * torch.randn(rows, generator=g)
        w[p + "self_attn.o_proj.weight"] = lin(h, nq * hd)
        w.update(moe_layer_weights(p, c, lin))
    w["model.norm.weight"] = gain(h)
    w["lm_head.weight"] = lin(vocab, h) * 4.0
    return {k: v.contiguous() for k, v in w.items()}


def main(out_dir: str | None = None, wide: bool = False) -> Path:
    out = Path(out_dir) if out_dir else Path(__file__).resolve().parent / "tiny_qwen_moe"
    config = WIDE_CONFIG if wide else CONFIG
    return save_model(out, config, make_weights(config=config))


if __name__ == "__main__":
    argv = [a for a in sys.argv[1:] if a != "--wide"]
    print(main(argv[0] if argv else None, wide="--wide" in sys.argv[1:]))
