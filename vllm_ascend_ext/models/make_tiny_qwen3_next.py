"""Generate the embedded tiny Qwen3-Next model (hybrid: Gated DeltaNet + gated attention, MoE).

    python -m vllm_ascend_ext.models.make_tiny_qwen3_next [OUT_DIR]

Four layers, three Gated-DeltaNet (linear attention) layers then one gated full-attention
layer (``full_attention_interval`` 4), each with a softmax top-2 of 4 experts MoE,
renormalised, plus a shared expert behind a sigmoid gate. Weight names are the HF
checkpoint's (per-expert ``mlp.experts.{e}.*_proj``, ``linear_attn.in_proj_qkvz`` /
``in_proj_ba`` / ``conv1d`` / ``A_log`` / ``dt_bias`` / ``norm`` / ``out_proj``, a
``q_proj`` twice as wide as the heads: query and output gate), which both
``transformers.Qwen3NextForCausalLM`` and vLLM's ``qwen3_next.py`` load.

Same tokenizer and scale conventions as ``make_tiny_qwen3`` (embeddings ~N(0, 1),
projections ~N(0, 1/fan_in)). Qwen3-Next's RMSNorms scale by ``1 + weight`` (zero-centred
weights: gains near 1 are weights near 0; q/k-norm gains of ~1.6 as in the tiny Qwen3),
except the gated norm of the DeltaNet output, which scales by ``weight``. ``exp(A_log)``
spans 0.1..1 and ``dt_bias`` is ~1, so the per-token decay ``exp(g)``,
``g = -exp(A_log) * softplus(a + dt_bias)``, keeps a few tokens of state (neither ~1 nor
~0); conv1d taps ~N(0, 1/K). The full-attention ``o_proj`` is doubled to make up for its
sigmoid output gate, and ``lm_head`` spreads logits over ~9 units with token-dependent row
norms: greedy top-1/top-2 margins have a median ~4 and are < 0.5 in ~6% of steps.

The DeltaNet head dims are 64, not 32: vLLM's CPU Gated-DeltaNet kernels take 64 or 128
only (and bfloat16 only). Tensors are stored in bfloat16 (values exact in float32; the
config says float32) so that the file stays under 2 MiB. Deterministic.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

from vllm_ascend_ext.models.make_tiny_qwen3 import save_model
from vllm_ascend_ext.models.make_tiny_qwen_moe import moe_layer_weights

CONFIG = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "hidden_size": 128,
    "intermediate_size": 256,  # dense MLP width: unused, every layer is MoE
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "full_attention_interval": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "partial_rotary_factor": 0.25,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "linear_conv_kernel_dim": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 64,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 0,
    "torch_dtype": "float32",
    "num_nextn_predict_layers": 1,
}

STORAGE_DTYPE = torch.bfloat16
MTP_HIDDEN_SCALE = 0.3


def _is_moe_layer(c: dict, i: int) -> bool:
    return (i not in c.get("mlp_only_layers", []) and c.get("num_experts", 0) > 0
            and (i + 1) % c.get("decoder_sparse_step", 1) == 0)


def _layer_weights(p: str, kind: str, moe: bool, c: dict, lin, offset) -> dict[str, torch.Tensor]:
    """One decoder layer's weights under prefix ``p``: ``kind`` is ``linear_attention``
    (Gated DeltaNet) or ``full_attention``; an MoE block when ``moe``, else a dense MLP."""
    h, hd = c["hidden_size"], c["head_dim"]
    nq, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    nk, nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv, kern = c["linear_key_head_dim"], c["linear_value_head_dim"], c["linear_conv_kernel_dim"]
    key_dim, value_dim = nk * dk, nv * dv
    g = lin.generator
    w = {p + "input_layernorm.weight": offset(h), p + "post_attention_layernorm.weight": offset(h)}
    if kind == "linear_attention":
        q = p + "linear_attn."
        # Rows per key head: qkvz [q (dk), k (dk), v (nv/nk * dv), z (nv/nk * dv)],
        # ba [b (nv/nk), a (nv/nk)].
        w[q + "in_proj_qkvz.weight"] = lin(2 * key_dim + 2 * value_dim, h)
        w[q + "in_proj_ba.weight"] = lin(2 * nv, h)
        w[q + "conv1d.weight"] = torch.randn(2 * key_dim + value_dim, 1, kern,
                                             generator=g) / kern**0.5
        a = torch.empty(nv).uniform_(math.log(0.1), 0.0, generator=g)
        w[q + "A_log"] = a  # exp(A_log) in [0.1, 1]
        w[q + "dt_bias"] = 1.0 + 0.3 * torch.randn(nv, generator=g)
        w[q + "norm.weight"] = 1.0 + 0.1 * torch.randn(dv, generator=g)  # plain gain
        w[q + "out_proj.weight"] = lin(h, value_dim)
    else:
        q = p + "self_attn."
        # Per head: [query (hd), gate (hd)].
        w[q + "q_proj.weight"] = lin(nq * hd * 2, h)
        w[q + "k_proj.weight"] = lin(nkv * hd, h)
        w[q + "v_proj.weight"] = lin(nkv * hd, h)
        w[q + "o_proj.weight"] = lin(h, nq * hd) * 2.0  # makes up for the sigmoid gate
        w[q + "q_norm.weight"] = offset(hd, 0.6, 0.2)
        w[q + "k_norm.weight"] = offset(hd, 0.6, 0.2)
    if moe:
        w.update(moe_layer_weights(p, c, lin))
    else:  # a dense SwiGLU MLP (mlp_only_layers, decoder_sparse_step)
        w[p + "mlp.gate_proj.weight"] = lin(c["intermediate_size"], h)
        w[p + "mlp.up_proj.weight"] = lin(c["intermediate_size"], h)
        w[p + "mlp.down_proj.weight"] = lin(h, c["intermediate_size"])
    return w


def _mtp_weights(c: dict, lin, offset) -> dict[str, torch.Tensor]:
    """The multi-token-prediction layers (``num_nextn_predict_layers``), under the HF
    checkpoint's ``mtp.`` prefix, which vLLM's ``Qwen3NextMTP`` loads (it shares the main
    model's ``embed_tokens`` and ``lm_head``): ``pre_fc_norm_embedding`` /
    ``pre_fc_norm_hidden``, ``fc`` over ``[embedding, hidden]``, one full-attention MoE
    decoder layer each, ``norm``. Untrained, the drafts still agree with the model often
    enough to accept some and reject others: ``fc`` passes the next token's embedding
    through (identity plus noise), the way the main model's residual stream carries it to
    its ``lm_head``, and mixes in the target's hidden state at a third of the scale."""
    h = c["hidden_size"]
    w = {}
    for k in range(c.get("num_nextn_predict_layers", 0)):
        if k == 0:
            w["mtp.pre_fc_norm_embedding.weight"] = offset(h)
            w["mtp.pre_fc_norm_hidden.weight"] = offset(h)
            embed_half = torch.eye(h) + 0.1 * lin(h, h)
            w["mtp.fc.weight"] = torch.cat([embed_half, MTP_HIDDEN_SCALE * lin(h, h)], dim=1)
            w["mtp.norm.weight"] = offset(h)
        w.update(_layer_weights(f"mtp.layers.{k}.", "full_attention", True, c, lin, offset))
    return w


def make_weights(seed: int = 0, config: dict | None = None) -> dict[str, torch.Tensor]:
    """Weights for ``config`` (default: the embedded model's ``CONFIG``); any widths, head
    counts, expert counts and layer patterns of the architecture."""
    g = torch.Generator().manual_seed(seed)
    c = CONFIG if config is None else config
    h, vocab = c["hidden_size"], c["vocab_size"]

    def lin(out_f: int, in_f: int) -> torch.Tensor:
        return torch.randn(out_f, in_f, generator=g) / in_f**0.5
    lin.generator = g

    def offset(n: int, center: float = 0.0, spread: float = 0.1) -> torch.Tensor:
        # Qwen3NextRMSNorm multiplies by (1 + weight): a gain of 1 + center.
        return center + spread * torch.randn(n, generator=g)

    w = {"model.embed_tokens.weight": torch.randn(vocab, h, generator=g)}
    for i, kind in enumerate(c["layer_types"]):
        w.update(_layer_weights(f"model.layers.{i}.", kind, _is_moe_layer(c, i), c, lin, offset))
    w["model.norm.weight"] = offset(h)
    # Logits spread over ~9 units, with token-dependent row norms (as in trained LMs: a heavier
    # top tail), so the top-1/top-2 margin of a greedy step is > 0.5 in ~90% of steps. The
    # special tokens (eos 0, bos 1) get small rows, as if rarely seen in training: greedy
    # continuations run their full length instead of stopping at an early eos.
    row_gain = torch.exp(0.3 * torch.randn(vocab, 1, generator=g))
    row_gain[[c["eos_token_id"], c["bos_token_id"]]] = 0.5
    w["lm_head.weight"] = lin(vocab, h) * (8.0 * row_gain)
    if c.get("tie_word_embeddings"):
        del w["lm_head.weight"]
    w.update(_mtp_weights(c, lin, offset))   # drawn last: the main model's bytes stay put
    return {k: v.to(STORAGE_DTYPE).contiguous() for k, v in w.items()}


def variant_config(overrides: dict) -> dict:
    """The embedded model's config with ``overrides``; ``layer_types`` follows
    ``num_hidden_layers`` and ``full_attention_interval`` unless given."""
    c = {**CONFIG, **overrides}
    if "layer_types" not in overrides:
        k = c["full_attention_interval"]
        c["layer_types"] = ["full_attention" if (i + 1) % k == 0 else "linear_attention"
                            for i in range(c["num_hidden_layers"])]
    if len(c["layer_types"]) != c["num_hidden_layers"]:
        raise ValueError(f"layer_types has {len(c['layer_types'])} entries for "
                         f"{c['num_hidden_layers']} layers")
    return c


def save_variant(out_dir: str | Path, overrides: dict, seed: int = 0) -> Path:
    """A checkpoint of another configuration of the architecture (other widths, head
    counts, experts, layers), same weight conventions, in ``out_dir``."""
    c = variant_config(overrides)
    return save_model(Path(out_dir), c, make_weights(seed, c))


def main(out_dir: str | None = None) -> Path:
    out = Path(out_dir) if out_dir else Path(__file__).resolve().parent / "tiny_qwen3_next"
    return save_model(out, CONFIG, make_weights())


if __name__ == "__main__":
    print(main(sys.argv[1] if len(sys.argv) > 1 else None))
