"""A tiny hybrid Qwen3-Next (3 Gated-DeltaNet layers + 1 full-attention layer, bf16,
dummy weights) under emulation, with ``mixed_split`` "on": prints which builders
served which layers (the plugin's GDN builder for the linear-attention layers, in bf16), how many mixed steps the full-attention builder split, and which
MoE method served its (4-expert, softmax top-2, shared-expert) MoE layers.

Dummy weights are enough here: this checks routing (the full-attention layer of a
hybrid model reaches the plugin's backend and its split), not numerics.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

CONFIG = {
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
    "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 1024,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "partial_rotary_factor": 0.25, "hidden_act": "silu", "attention_bias": False,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"], "full_attention_interval": 4,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 64,
    "linear_value_head_dim": 64, "linear_conv_kernel_dim": 4, "num_experts": 4,
    "num_experts_per_tok": 2, "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64, "decoder_sparse_step": 1, "norm_topk_prob": True,
    "mlp_only_layers": [], "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 0,
    "torch_dtype": "bfloat16",
}


def main() -> None:
    from vllm import LLM, SamplingParams

    from vllm_ascend_ext.models import TINY_QWEN3

    with tempfile.TemporaryDirectory() as model:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(TINY_QWEN3 / name, os.path.join(model, name))
        with open(os.path.join(model, "config.json"), "w") as f:
            json.dump(CONFIG, f)
        llm = LLM(model=model, dtype="bfloat16", load_format="dummy", max_model_len=512,
                  enable_prefix_caching=False, max_num_batched_tokens=32, enforce_eager=True,
                  additional_config={"ascend_ext": {"mixed_split": "on"}})
        runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
        prompts = ["the quick brown fox " * 5, "numbers like 1 2 3", "a b c d e f g"] * 3
        llm.generate(prompts, SamplingParams(max_tokens=8, temperature=0.0), use_tqdm=False)
        builders = [{"builder": type(b).__name__, "layers": list(b.layer_names),
                     "mixed": getattr(getattr(b, "stats", None), "mixed", None),
                     "split": getattr(getattr(b, "stats", None), "split", None)}
                    for g in runner._attn_group_iterator() for b in g.metadata_builders]
        moe = sorted({type(m.quant_method).__name__ for m in runner.model.modules()
                      if "MoE" in type(getattr(m, "quant_method", None)).__name__})
        from engine_info import engine_info

        engine = engine_info(llm)
        moe_layers = sum(1 for m in runner.model.modules()
                         if "MoE" in type(getattr(m, "quant_method", None)).__name__)
    print("RESULT " + json.dumps({"builders": builders, "moe_methods": moe,
                                  "moe_layers": moe_layers, "engine": engine}))


if __name__ == "__main__":
    main()
