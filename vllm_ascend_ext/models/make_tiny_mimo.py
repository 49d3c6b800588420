"""Generate the embedded tiny MiMo-style model: a dense GQA model (Qwen2 attention with
q/k/v biases) with one MTP layer, so MTP speculation runs on the FIA backend with decode
graphs (verify batches of ``1 + k`` tokens per request).

    python -m vllm_ascend_ext.models.make_tiny_mimo [OUT_DIR]

The layout is XiaomiMiMo/MiMo-7B's: ``MiMoForCausalLM`` for the main model and
``model.mtp_layers.0.*`` for the MTP layer (token and hidden norms, ``input_proj`` over
their concatenation, a Qwen2 decoder block, a final norm), which vLLM serves as
``MiMoMTPModel``. ``model_type`` is ``qwen2`` (MiMo's own config class extends Qwen2's and
needs remote code). Deterministic, at the scale the other tiny models use (projections
~N(0, 1/fan_in), norm gains near 1); the query projection is scaled so that attention
logits spread over a few units without q/k norms. The MTP tensors are drawn after the
main ones and are untrained.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from vllm_ascend_ext.models.make_tiny_qwen3 import save_model

CONFIG = {
    "architectures": ["MiMoForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 128,          # Qwen2 attention: head_dim = hidden / heads = 64
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "num_nextn_predict_layers": 1,
    "bos_token_id": 1,
    "eos_token_id": 0,
    "torch_dtype": "float32",
}

Q_SCALE = 2.0   # no q/k norm: widen the attention logits


def _block(w: dict, p: str, g: torch.Generator) -> None:
    c = CONFIG
    h, inter = c["hidden_size"], c["intermediate_size"]
    nq, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    hd = h // nq

    def lin(out_f: int, in_f: int) -> torch.Tensor:
        return torch.randn(out_f, in_f, generator=g) / in_f**0.5

    def gain(n: int) -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(n, generator=g)

    w[p + "input_layernorm.weight"] = gain(h)
    w[p + "post_attention_layernorm.weight"] = gain(h)
    w[p + "self_attn.q_proj.weight"] = lin(nq * hd, h) * Q_SCALE
    w[p + "self_attn.q_proj.bias"] = 0.1 * torch.randn(nq * hd, generator=g)
    w[p + "self_attn.k_proj.weight"] = lin(nkv * hd, h)
    w[p + "self_attn.k_proj.bias"] = 0.1 * torch.randn(nkv * hd, generator=g)
    w[p + "self_attn.v_proj.weight"] = lin(nkv * hd, h)
    w[p + "self_attn.v_proj.bias"] = 0.1 * torch.randn(nkv * hd, generator=g)
    w[p + "self_attn.o_proj.weight"] = lin(h, nq * hd)
    w[p + "mlp.gate_proj.weight"] = lin(inter, h)
    w[p + "mlp.up_proj.weight"] = lin(inter, h)
    w[p + "mlp.down_proj.weight"] = lin(h, inter)


def make_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    c = CONFIG
    h, vocab = c["hidden_size"], c["vocab_size"]
    w = {"model.embed_tokens.weight": torch.randn(vocab, h, generator=g)}
    for i in range(c["num_hidden_layers"]):
        _block(w, f"model.layers.{i}.", g)
    w["model.norm.weight"] = 1.0 + 0.1 * torch.randn(h, generator=g)
    w["lm_head.weight"] = torch.randn(vocab, h, generator=g) / h**0.5 * 4.0
    for i in range(c["num_nextn_predict_layers"]):   # drawn last: untrained MTP layers
        p = f"model.mtp_layers.{i}."
        w[p + "token_layernorm.weight"] = 1.0 + 0.1 * torch.randn(h, generator=g)
        w[p + "hidden_layernorm.weight"] = 1.0 + 0.1 * torch.randn(h, generator=g)
        w[p + "input_proj.weight"] = torch.randn(h, 2 * h, generator=g) / (2 * h)**0.5
        _block(w, p, g)
        w[p + "final_layernorm.weight"] = 1.0 + 0.1 * torch.randn(h, generator=g)
    return {k: v.contiguous() for k, v in w.items()}


def main(out_dir: str | None = None) -> Path:
    out = Path(out_dir) if out_dir else Path(__file__).resolve().parent / "tiny_mimo"
    return save_model(out, CONFIG, make_weights())


if __name__ == "__main__":
    print(main(sys.argv[1] if len(sys.argv) > 1 else None))
