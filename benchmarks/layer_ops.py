"""Operator launches per decoder layer per decode step: the plugin's fused layer ops
against vLLM's native PyTorch ones, beside vllm-ascend's count.

    python benchmarks/layer_ops.py [--kinds qwen3,qwen-moe,qwen3-next,dsa-w8a8-dense,dsa-w8a8]

For each layer kind it runs an embedded tiny model (emulated platform, real vLLM, bf16
as served, eager) in a subprocess per variant: ``ascend_ext.layer_ops`` = ``native`` (vLLM's own
``forward_native`` for RMSNorm, RoPE and SiluAndMul: stock vLLM's path) and ``fused``
(the plugin's torch_npu operators). Operator calls are counted at the dispatcher level
(``vllm_ascend_ext.ops.counting``: a plugin NPU operator once, its reference's internals
not at all; views not counted), inside one decoder layer during the last decode step,
split by piece with forward hooks on the layer's submodules:

- input / post-attention norm: the layer's ``input_layernorm`` / ``post_attention_layernorm``;
- q/k norm: ``q_norm`` + ``k_norm`` (Qwen3, Qwen3-Next); rope: ``rotary_emb``;
- activation: the MLP block's ``act_fn`` modules plus ``npu_swiglu`` calls of its routed
  experts, and ``npu_dequant_swiglu_quant`` (a W8A8 MLP's dequantization, SwiGLU and
  re-quantization in one launch); activation quant: ``npu_dynamic_quant`` calls inside
  the MLP block (a post-attention norm fused with the MLP's quantization counts as the
  norm's one launch).

The counts are hardware-independent: on an NPU each counted call is one kernel launch.
vllm-ascend's column is read from its code at a named commit (``docs/layer-ops.md``
gives the reasoning per piece); it is not measured here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import Counter

VARIANTS = ("native", "fused")
PIECES = ("input norm", "post-attention norm", "q/k norm", "rope", "activation",
          "activation quant")
# kind -> (tiny model name, label, which decoder layer (index among layers with a
# post_attention_layernorm, or "full" for the first full-attention layer), dtype).
# bf16 as served on an NPU, except the tiny Qwen3-Next: its rotary_dim (16) is a multiple
# of 32 only in fp32's rule (npu_mrope asks 32 in bf16); the real model's 64 is in both.
KINDS = {
    "qwen3": ("qwen3", "Qwen3 dense", 1, "bfloat16"),
    "qwen-moe": ("qwen-moe", "Qwen MoE layer (tiny: Qwen2-MoE, a shared expert, no q/k norm)", 1,
                 "bfloat16"),
    "qwen3-next": ("qwen3-next", "Qwen3-Next full-attention layer", "full", "float32"),
    "dsa-w8a8-dense": ("dsa-w8a8", "DeepSeek-V3.2 W8A8 dense layer", 0, "bfloat16"),
    "dsa-w8a8": ("dsa-w8a8", "DeepSeek-V3.2 W8A8 MoE layer", 1, "bfloat16"),
}
# vllm-ascend @ 182b75ea84ff (eager, A2/A3, bf16, Triton-Ascend installed), per piece of
# the same layer structure; None: the piece runs inside its attention op. Reasoning and
# file/line references: docs/layer-ops.md.
VLLM_ASCEND_COMMIT = "182b75ea84ff"
VLLM_ASCEND = {
    "qwen3": {"input norm": 1, "post-attention norm": 1, "q/k norm": 2, "rope": 1,
              "activation": 1, "activation quant": 0},
    "qwen-moe": {"input norm": 1, "post-attention norm": 1, "q/k norm": 0, "rope": 1,
                 "activation": 2, "activation quant": 0},
    "qwen3-next": {"input norm": 2, "post-attention norm": 2, "q/k norm": 2, "rope": 1,
                   "activation": 2, "activation quant": 0},
    "dsa-w8a8-dense": {"input norm": 1, "post-attention norm": 1, "q/k norm": None,
                       "rope": None, "activation": 1, "activation quant": 2},
    "dsa-w8a8": {"input norm": 1, "post-attention norm": 1, "q/k norm": None, "rope": None,
                 "activation": 1, "activation quant": 1},
}
# What vllm-ascend's graph-mode fusion passes (on by default with ACL graphs) change.
VLLM_ASCEND_GRAPH = {
    "qwen3": "its qknorm_rope_fusion_pass (bf16, head_dim 128) turns q/k norm + rope (3) into "
             "one Triton kernel: 4 in graph mode",
    "qwen-moe": "graph mode: unchanged for this layer (no q/k norm)",
    "qwen3-next": "graph mode: unchanged (no pass matches Gemma norms)",
    "dsa-w8a8-dense": "its norm_quant_fusion_pass may fuse the post-attention add-norm with "
                      "gate_up's quant (not verified on A2/A3): 4 in graph mode if it fires",
    "dsa-w8a8": "graph mode: unchanged (the shared expert's quant is inside the MoE op)",
}
_HOOKED = {"input_layernorm": "input norm", "post_attention_layernorm": "post-attention norm",
           "q_norm": "q/k norm", "k_norm": "q/k norm", "rotary_emb": "rope",
           "act_fn": "activation"}


def _pick_layer(model, which):
    layers = [m for m in model.modules() if hasattr(m, "post_attention_layernorm")
              and hasattr(m, "input_layernorm")]
    if which == "full":
        return next(m for m in layers if hasattr(m, "self_attn"))
    return layers[which]


def child(kind: str, variant: str) -> dict:
    from vllm import LLM, SamplingParams

    from vllm_ascend_ext.cli.plugin_commands import _tiny_paths
    from vllm_ascend_ext.ops.counting import OpCounter

    model_name = KINDS[kind][0]
    llm = LLM(model=_tiny_paths()[model_name](), dtype=KINDS[kind][3], seed=0, max_model_len=512,
              enforce_eager=True, additional_config={"ascend_ext": {"layer_ops": variant}})
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    layer = _pick_layer(runner.model, KINDS[kind][2])
    active: list[OpCounter] = []  # the counter, while the measured generate runs
    forwards: list[dict] = []
    open_marks: dict[int, Counter] = {}

    def snapshot() -> Counter:
        return Counter(active[0].steps[-1].ops) if active else Counter()

    inside: list[bool] = [False]  # in the chosen layer (vLLM shares one rotary_emb module)

    def pre(piece):
        def hook(module, args, kwargs=None):
            if piece == "layer":
                inside[0] = True
            if inside[0]:
                open_marks[id(module)] = snapshot()
        return hook

    def post(piece):
        def hook(module, args, output):
            if not active or not inside[0]:
                return
            if piece == "layer":
                inside[0] = False
            delta = snapshot()
            delta.subtract(open_marks.pop(id(module)))
            delta = +delta
            if piece == "layer":
                forwards.append({"layer": dict(delta), "pieces": dict(current)})
                current.clear()
            elif piece == "mlp":
                current["mlp npu_swiglu"] = current.get("mlp npu_swiglu", 0) + delta["npu_swiglu"]
            elif piece == "attention":
                current["attention quant"] = (current.get("attention quant", 0)
                                              + delta["npu_dynamic_quant"])
            else:
                current[piece] = current.get(piece, 0) + sum(delta.values())
                if piece == "activation":
                    current["act_fn npu_swiglu"] = (current.get("act_fn npu_swiglu", 0)
                                                    + delta["npu_swiglu"])
        return hook

    current: dict = {}
    for name, module in layer.named_modules():
        piece = {"": "layer", "mlp": "mlp", "self_attn": "attention"}.get(name) or _HOOKED.get(
            name.split(".")[-1])
        if piece is not None:
            module.register_forward_pre_hook(pre(piece))
            module.register_forward_hook(post(piece))
    sp = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    prompts = ["the quick brown fox jumps over the lazy dog", "numbers like 1 2 3 and then"]
    with OpCounter() as counter:
        active.append(counter)
        out = llm.generate(prompts, sp, use_tqdm=False)
    last = forwards[-1]
    got, ops = last["pieces"], Counter(last["layer"])
    pieces = {p: got.get(p, 0) for p in PIECES}
    # Routed experts' npu_swiglu (inside the MoE method, outside any act_fn) is activation.
    pieces["activation"] += max(0, got.get("mlp npu_swiglu", 0) - got.get("act_fn npu_swiglu", 0))
    # A W8A8 MLP's activation as one launch (layers/w8a8_mlp.py: no act_fn module runs).
    pieces["activation"] += ops["npu_dequant_swiglu_quant"]
    # Quantizations of the layer outside its attention (the MLP's), and the fused
    # post-attention norm + quantization, which runs in place of the norm module.
    pieces["activation quant"] = ops["npu_dynamic_quant"] - got.get("attention quant", 0)
    pieces["post-attention norm"] += ops["npu_add_rms_norm_dynamic_quant"]
    return {"pieces": pieces, "layer_total": sum(last["layer"].values()),
            "layer_ops": last["layer"], "tokens": [o.outputs[0].token_ids for o in out]}


def run_child(kind: str, variant: str) -> dict:
    env = dict(os.environ, ASCEND_EXT_EMULATE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0",
               VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run([sys.executable, __file__, "--child", kind, variant], env=env,
                          capture_output=True, text=True, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise SystemExit(f"{kind}/{variant} failed:\n{proc.stderr[-3000:]}")


def _cell(value) -> str:
    return "in attention op" if value is None else str(value)


def table(kind: str, results: dict[str, dict]) -> list[str]:
    native, fused = results["native"]["pieces"], results["fused"]["pieces"]
    ascend = VLLM_ASCEND[kind]
    lines = [f"### {KINDS[kind][1]} (tiny `{KINDS[kind][0]}`, {KINDS[kind][3]})", "",
             f"| piece | stock vLLM (native) | plugin (fused) | vllm-ascend @{VLLM_ASCEND_COMMIT} |",
             "|---|---:|---:|---:|"]
    for p in PIECES:
        lines.append(f"| {p} | {native[p]} | {fused[p]} | {_cell(ascend[p])} |")
    n, f = sum(native.values()), sum(fused.values())
    a = sum(v for v in ascend.values() if v is not None)
    lines.append(f"| **these pieces** | **{n}** | **{f}** | **{a}** |")
    lines.append(f"| whole layer (attention, GEMMs, MoE included) | "
                 f"{results['native']['layer_total']} | {results['fused']['layer_total']} | |")
    same = results["native"]["tokens"] == results["fused"]["tokens"]
    lines += ["", f"pieces: {n} -> {f} launches ({n / max(f, 1):.1f}x fewer than stock); "
              f"vs vllm-ascend (eager): {f - a:+d}; greedy tokens native == fused: {same}",
              f"vllm-ascend: {VLLM_ASCEND_GRAPH[kind]}", ""]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--child", nargs=2, metavar=("KIND", "VARIANT"))
    parser.add_argument("--json", action="store_true", help="print the raw results as JSON")
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(*args.child)), flush=True)
        return
    everything = {}
    lines = ["## Launches per decoder layer per decode step (emulated, dispatcher level)", ""]
    for kind in args.kinds.split(","):
        results = {v: run_child(kind, v) for v in VARIANTS}
        everything[kind] = results
        lines += table(kind, results)
    print(json.dumps(everything) if args.json else "\n".join(lines))


if __name__ == "__main__":
    main()
