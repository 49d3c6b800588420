"""Generate the embedded tiny DeepSeek-V3.2-style (DSA) models: float and W8A8.

    python -m vllm_ascend_ext.models.make_tiny_dsa [OUT_ROOT] [--wide]

writes ``tiny_dsa/`` (float weights) and ``tiny_dsa_w8a8/`` (the same weights with
the linear layers ModelSlim quantizes stored as W8A8_DYNAMIC, plus
``quant_model_description.json``). Deterministic (fixed seed); the tokenizer is the
tiny Qwen3's. Realistic-scale weights (vLLM's dummy weights are U(-1e-3, 1e-3) and
hide attention bugs): projections ~N(0, 1/fan_in), RMSNorm gains near 1, latent
and query-lora gains ~1.6 so MLA logits spread over a few units. ``index_topk`` is
32, so prompts of 128+ tokens make the indexer drop most visible keys. One MTP layer
(``num_nextn_predict_layers`` 1, layer 2), drawn after every other tensor.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch

CONFIG = {
    "architectures": ["DeepseekV32ForCausalLM"],
    "model_type": "deepseek_v32",
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 64,
    "kv_lora_rank": 128,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 64,
    "v_head_dim": 32,
    "index_n_heads": 16,
    "index_head_dim": 128,
    "index_topk": 32,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.0,
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "hidden_act": "silu",
    "attention_bias": False,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 0,
    "torch_dtype": "float32",
    "num_nextn_predict_layers": 1,
}

# A wider variant for MC2 (expert-parallel dispatch), whose operators document hidden
# sizes from 1024 on Atlas A3: generated on first use into the user's cache
# (``models.tiny_dsa_w8a8_wide_path``), not shipped.
WIDE_CONFIG = {**CONFIG, "hidden_size": 1024}

# What ModelSlim's W8A8 dynamic recipe quantizes here: attention projections (but
# not kv_b_proj, which MLA absorbs), the indexer's wq_b, dense MLP, shared and routed
# experts.
QUANTIZED = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "o_proj", "indexer.wq_b",
             "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "shared_experts.gate_proj",
             "shared_experts.up_proj", "shared_experts.down_proj")


def make_weights(seed: int = 0, c: dict = CONFIG) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    h, n = c["hidden_size"], c["num_attention_heads"]
    dn, dr, dv = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    ql, kl = c["q_lora_rank"], c["kv_lora_rank"]
    ni, di = c["index_n_heads"], c["index_head_dim"]

    def lin(out_f: int, in_f: int) -> torch.Tensor:
        return torch.randn(out_f, in_f, generator=g) / in_f**0.5

    def gain(size: int, center: float, spread: float) -> torch.Tensor:
        return center + spread * torch.randn(size, generator=g)

    def mlp(p: str, inter: int) -> None:
        w[p + "gate_proj.weight"] = lin(inter, h)
        w[p + "up_proj.weight"] = lin(inter, h)
        w[p + "down_proj.weight"] = lin(h, inter)

    def layer(i: int) -> None:
        p = f"model.layers.{i}."
        a = p + "self_attn."
        w[p + "input_layernorm.weight"] = gain(h, 1.0, 0.1)
        w[p + "post_attention_layernorm.weight"] = gain(h, 1.0, 0.1)
        w[a + "q_a_proj.weight"] = lin(ql, h)
        w[a + "q_a_layernorm.weight"] = gain(ql, 1.6, 0.2)
        w[a + "q_b_proj.weight"] = lin(n * (dn + dr), ql)
        w[a + "kv_a_proj_with_mqa.weight"] = lin(kl + dr, h)
        w[a + "kv_a_layernorm.weight"] = gain(kl, 1.6, 0.2)
        w[a + "kv_b_proj.weight"] = lin(n * (dn + dv), kl)
        w[a + "o_proj.weight"] = lin(h, n * dv)
        w[a + "indexer.wq_b.weight"] = lin(ni * di, ql)
        w[a + "indexer.wk.weight"] = lin(di, h)
        w[a + "indexer.weights_proj.weight"] = lin(ni, h)
        w[a + "indexer.k_norm.weight"] = gain(di, 1.0, 0.1)
        w[a + "indexer.k_norm.bias"] = 0.1 * torch.randn(di, generator=g)
        if i < c["first_k_dense_replace"]:
            mlp(p + "mlp.", c["intermediate_size"])
        else:
            w[p + "mlp.gate.weight"] = lin(c["n_routed_experts"], h)
            w[p + "mlp.gate.e_score_correction_bias"] = 0.1 * torch.randn(
                c["n_routed_experts"], generator=g)
            for e in range(c["n_routed_experts"]):
                mlp(p + f"mlp.experts.{e}.", c["moe_intermediate_size"])
            mlp(p + "mlp.shared_experts.", c["moe_intermediate_size"] * c["n_shared_experts"])

    w = {"model.embed_tokens.weight": torch.randn(c["vocab_size"], h, generator=g)}
    for i in range(c["num_hidden_layers"]):
        layer(i)
    w["model.norm.weight"] = gain(h, 1.0, 0.1)
    w["lm_head.weight"] = lin(c["vocab_size"], h) * 4.0
    # The MTP (next-n) layers, drawn last so that the main model's bytes stay put: layer
    # ``num_hidden_layers + k`` as DeepSeek checkpoints store it (a decoder layer plus
    # ``enorm`` / ``hnorm`` / ``eh_proj`` / ``shared_head.norm``; ``embed_tokens`` and
    # ``shared_head.head`` are the main model's, which vLLM's proposer shares). Untrained:
    # ``eh_proj`` passes the next token's embedding through (identity plus noise) and mixes
    # in the target's hidden state at a third of the scale.
    for k in range(c.get("num_nextn_predict_layers", 0)):
        i = c["num_hidden_layers"] + k
        layer(i)
        p = f"model.layers.{i}."
        w[p + "enorm.weight"] = gain(h, 1.0, 0.1)
        w[p + "hnorm.weight"] = gain(h, 1.0, 0.1)
        w[p + "eh_proj.weight"] = torch.cat([torch.eye(h) + 0.1 * lin(h, h),
                                             0.3 * lin(h, h)], dim=1)
        w[p + "shared_head.norm.weight"] = gain(h, 1.0, 0.1)
    return {k: v.contiguous() for k, v in w.items()}


def is_quantized(name: str) -> bool:
    if not name.endswith(".weight"):
        return False
    if ".mlp.experts." in name:
        return name.endswith(("_proj.weight",))
    return any(f".{q}.weight" in name for q in QUANTIZED)


def quantize_w8a8(weights: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    """Per-output-channel symmetric int8 (ModelSlim W8A8_DYNAMIC tensors) + description."""
    out: dict[str, torch.Tensor] = {}
    desc: dict[str, str] = {"model_quant_type": "W8A8_DYNAMIC", "version": "1.0.0"}
    for name, t in weights.items():
        if is_quantized(name):
            scale = t.abs().amax(dim=1, keepdim=True) / 127.0
            base = name[: -len(".weight")]
            out[name] = torch.round(t / scale).clamp(-128, 127).to(torch.int8)
            out[base + ".weight_scale"] = scale.float()
            out[base + ".weight_offset"] = torch.zeros_like(scale)
            for suffix in (".weight", ".weight_scale", ".weight_offset"):
                desc[base + suffix] = "W8A8_DYNAMIC"
        else:
            out[name] = t
            desc[name] = "FLOAT"
    return out, desc


def main(out_root: str | None = None, wide: bool = False) -> tuple[Path, Path]:
    """Writes ``tiny_dsa`` and ``tiny_dsa_w8a8`` under ``out_root`` (``wide``: at
    ``WIDE_CONFIG``'s hidden size, as ``tiny_dsa_wide`` and ``tiny_dsa_w8a8_wide``)."""
    from safetensors.torch import save_file

    from vllm_ascend_ext.models import TINY_QWEN3

    root = Path(out_root) if out_root else Path(__file__).resolve().parent
    config = WIDE_CONFIG if wide else CONFIG
    weights = make_weights(c=config)
    tail = "_wide" if wide else ""
    outs = []
    for sub, tensors, desc in ((f"tiny_dsa{tail}", weights, None),
                               (f"tiny_dsa_w8a8{tail}", *quantize_w8a8(weights))):
        out = root / sub
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (out / "generation_config.json").write_text(json.dumps(
            {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]},
            indent=2) + "\n")
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(TINY_QWEN3 / f, out / f)
        stored = {k: (v.to(torch.bfloat16) if v.is_floating_point() and not k.endswith(
            ("_scale", "_offset")) else v) for k, v in tensors.items()}
        save_file(stored, str(out / "model.safetensors"), metadata={"format": "pt"})
        if desc is not None:
            (out / "quant_model_description.json").write_text(json.dumps(desc, indent=2) + "\n")
        outs.append(out)
    return outs[0], outs[1]


if __name__ == "__main__":
    argv = [a for a in sys.argv[1:] if a != "--wide"]
    print(*main(argv[0] if argv else None, wide="--wide" in sys.argv[1:]))
