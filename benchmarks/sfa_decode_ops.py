"""Operator launches per decode step: native SFA preprocessing vs the fused MLA prolog.

    python benchmarks/sfa_decode_ops.py [--prompts 8] [--max-tokens 16]

Runs the embedded tiny W8A8 DeepSeek-V3.2-style model (emulated platform, real
vLLM, fp32) twice in subprocesses, with ``ascend_ext.sfa.preprocess`` = ``native``
and ``auto`` (which takes ``npu_mla_prolog_v3`` for W8A8 layers), counting operator
calls at the dispatcher level over every decode step (``vllm_ascend_ext.ops.counting``:
each plugin NPU operator counted once, its reference's internals not at all; views
not counted). Prints a kernel-profile-style table, per decode step, and the total
reduction. The counts are hardware-independent; on an NPU each counted call is one
kernel launch (CPU-only ops such as vLLM's sampler are counted as they appear here).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import Counter

VARIANTS = ("native", "auto")


def child(variant: str, prompts: int, max_tokens: int) -> dict:
    from vllm import LLM, SamplingParams

    from vllm_ascend_ext.attention.sfa.builder import AscendSFAMetadataBuilder
    from vllm_ascend_ext.models import tiny_dsa_path
    from vllm_ascend_ext.ops.counting import OpCounter

    llm = LLM(model=tiny_dsa_path(quantized=True), dtype="float32", seed=0, max_model_len=1024,
              additional_config={"ascend_ext": {"sfa": {"preprocess": variant}}})
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    layers = runner.model.sfa_layers()
    words = "the quick brown fox jumps over the lazy dog a decode step reads every token".split()
    ps = [" ".join(words[(i + j) % len(words)] for j in range(150)) for i in range(prompts)]
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    with OpCounter(steps_of=AscendSFAMetadataBuilder) as c:
        llm.generate(ps, sp, use_tqdm=False)
    # A step's bucket also holds the runner's work after the forward (sampling, the next
    # step's input preparation); the last decode step is followed by no further step.
    decodes = [s for s in c.steps if s.kind == "decode"][:-1]
    total: Counter = Counter()
    in_layers: Counter = Counter()
    in_moe: Counter = Counter()
    for s in decodes:
        total.update(s.ops)
        in_layers.update(s.in_layers)
        in_moe.update(s.in_moe)
    from vllm_ascend_ext.moe.method import MonolithicEntry

    moe_layers = sum(1 for m in runner.model.modules()
                     if isinstance(getattr(m, "quant_method", None), MonolithicEntry))
    return {"route": layers[0].route.preprocess, "layers": len(layers),
            "decode_steps": len(decodes), "ops": dict(total), "in_layers": dict(in_layers),
            "in_moe": dict(in_moe), "moe_layers": moe_layers}


def spawn(variant: str, prompts: int, max_tokens: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_EXT_")}
    env.update(ASCEND_EXT_EMULATE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0",
               VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run([sys.executable, __file__, "--child", variant, "--prompts", str(prompts),
                           "--max-tokens", str(max_tokens)], env=env, capture_output=True,
                          text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"child {variant} failed:\n{proc.stderr[-4000:]}")


def table(runs: dict[str, dict]) -> str:
    per_step = {v: {k: n / r["decode_steps"] for k, n in r["ops"].items()} for v, r in runs.items()}
    names = sorted(set().union(*per_step.values()),
                   key=lambda k: -max(per_step[v].get(k, 0) for v in runs))
    a, b = VARIANTS
    lines = [f"{'operator (calls per decode step)':44s} {'native':>9s} {'prolog':>9s} {'delta':>9s}"]
    for k in names:
        x, y = per_step[a].get(k, 0.0), per_step[b].get(k, 0.0)
        if x or y:
            lines.append(f"{k:44s} {x:9.1f} {y:9.1f} {y - x:+9.1f}")
    ta, tb = (sum(per_step[v].values()) for v in VARIANTS)
    lines.append(f"{'TOTAL (whole decode step)':44s} {ta:9.1f} {tb:9.1f} {tb - ta:+9.1f}")
    la, lb = (sum(r["in_layers"].values()) / r["decode_steps"] for r in runs.values())
    lines.append(f"{'  of which inside the SFA attention layers':44s} {la:9.1f} {lb:9.1f} "
                 f"{lb - la:+9.1f}")
    lines.append(f"fused prolog route: {100 * (tb - ta) / ta:+.1f}% operator calls per decode step, "
                 f"{100 * (lb - la) / la:+.1f}% inside the attention layers "
                 f"({runs[a]['layers']} SFA layers, {runs[a]['decode_steps']} decode steps each)")
    lines.append("")
    lines.append(moe_table(runs))
    return "\n".join(lines)


def moe_table(runs: dict[str, dict]) -> str:
    """The routed experts' operator calls per MoE layer per decode step (the plugin's MoE
    method; the same in both variants, and constant in experts and tokens)."""
    per_layer = {v: {k: n / (r["decode_steps"] * r["moe_layers"]) for k, n in r["in_moe"].items()}
                 for v, r in runs.items()}
    a, b = VARIANTS
    lines = [f"{'MoE routed experts (calls per layer per step)':44s} {'native':>9s} {'prolog':>9s}"]
    for k in sorted(set(per_layer[a]) | set(per_layer[b])):
        lines.append(f"{k:44s} {per_layer[a].get(k, 0.0):9.1f} {per_layer[b].get(k, 0.0):9.1f}")
    lines.append(f"{'TOTAL per MoE layer':44s} {sum(per_layer[a].values()):9.1f} "
                 f"{sum(per_layer[b].values()):9.1f}   ({runs[a]['moe_layers']} MoE layer(s))")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", choices=VARIANTS)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.prompts, args.max_tokens)))
        return
    runs = {v: spawn(v, args.prompts, args.max_tokens) for v in VARIANTS}
    assert runs["native"]["route"] == "native" and runs["auto"]["route"] == "prolog_v3", runs
    print(table(runs))


if __name__ == "__main__":
    main()
