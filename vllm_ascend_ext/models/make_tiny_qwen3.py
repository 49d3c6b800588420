"""Generate the embedded tiny Qwen3-style model: config, tokenizer, weights.

    python -m vllm_ascend_ext.models.make_tiny_qwen3 [OUT_DIR]

Deterministic (fixed seeds). Weights have a realistic scale, unlike vLLM's
``load_format="dummy"`` (U(-1e-3, 1e-3)), under which attention barely moves the
logits: embeddings ~N(0, 1), projections ~N(0, 1/fan_in), RMSNorm gains near 1,
and q/k-norm gains of ~1.6 so attention logits spread over a few units and a
wrong key or mask visibly changes the output.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "bos_token_id": 1,
    "eos_token_id": 0,
    "torch_dtype": "float32",
}

_CORPUS_SEED = (
    "the quick brown fox jumps over the lazy dog. attention is computed over keys and "
    "values stored in a paged cache. a decode step reads every cached token of its "
    "request, while a prefill chunk attends causally to the prefix and to itself. "
    "ascend npus run fused attention kernels; the emulation runs reference kernels on "
    "the cpu. numbers like 0 1 2 3 4 5 6 7 8 9 10 100 1000 appear in text. "
)


def _corpus() -> list[str]:
    import random

    rng = random.Random(0)
    words = _CORPUS_SEED.replace(".", " .").split()
    lines = [_CORPUS_SEED]
    for _ in range(400):
        lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(5, 30))))
    return lines


CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def make_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=CONFIG["vocab_size"],
        special_tokens=["<|endoftext|>", "<|startoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|endoftext|>",
        "bos_token": "<|startoftext|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": CONFIG["max_position_embeddings"],
        "add_bos_token": False,
        # Plain "role: content" lines (the vocabulary has no chat tokens), so that vLLM's
        # chat endpoint and `chat` command work on the tiny models.
        "chat_template": CHAT_TEMPLATE,
    }, indent=2) + "\n")


def make_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    c = CONFIG
    h, inter, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    nq, nkv, vocab = c["num_attention_heads"], c["num_key_value_heads"], c["vocab_size"]

    def lin(out_f: int, in_f: int) -> torch.Tensor:
        return torch.randn(out_f, in_f, generator=g) / in_f**0.5

    def gain(n: int, center: float, spread: float) -> torch.Tensor:
        return center + spread * torch.randn(n, generator=g)

    w = {"model.embed_tokens.weight": torch.randn(vocab, h, generator=g)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = gain(h, 1.0, 0.1)
        w[p + "post_attention_layernorm.weight"] = gain(h, 1.0, 0.1)
        w[p + "self_attn.q_proj.weight"] = lin(nq * hd, h)
        w[p + "self_attn.k_proj.weight"] = lin(nkv * hd, h)
        w[p + "self_attn.v_proj.weight"] = lin(nkv * hd, h)
        w[p + "self_attn.o_proj.weight"] = lin(h, nq * hd)
        w[p + "self_attn.q_norm.weight"] = gain(hd, 1.6, 0.2)
        w[p + "self_attn.k_norm.weight"] = gain(hd, 1.6, 0.2)
        w[p + "mlp.gate_proj.weight"] = lin(inter, h)
        w[p + "mlp.up_proj.weight"] = lin(inter, h)
        w[p + "mlp.down_proj.weight"] = lin(h, inter)
    w["model.norm.weight"] = gain(h, 1.0, 0.1)
    w["lm_head.weight"] = lin(vocab, h) * 4.0  # logits spread over a few units
    return {k: v.contiguous() for k, v in w.items()}


def save_model(out: Path, config: dict, weights: dict[str, torch.Tensor]) -> Path:
    """Write a tiny model directory: config, generation config, tokenizer, weights."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]},
        indent=2) + "\n")
    make_tokenizer(out)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def main(out_dir: str | None = None) -> Path:
    out = Path(out_dir) if out_dir else Path(__file__).resolve().parent / "tiny_qwen3"
    return save_model(out, CONFIG, make_weights())


if __name__ == "__main__":
    print(main(sys.argv[1] if len(sys.argv) > 1 else None))
