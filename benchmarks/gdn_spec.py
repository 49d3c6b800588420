"""Per-step operator counts of the GDN layers: plain vs speculative (ngram) decoding.

    python benchmarks/gdn_spec.py [--prompts 8] [--max-tokens 24]

Runs the embedded tiny Qwen3-Next (3 Gated-DeltaNet + 1 full-attention layer; emulated
A2, fp32, real vLLM) twice in subprocesses — plain decoding and ngram speculation with
3 drafts — counting operators at the dispatcher level inside the GDN layers' opaque entry
op (``ascend_ext.gdn_forward``; each plugin NPU operator counted once, its reference's
internals not at all; views not counted), bucketed per step by the GDN builder. Prints,
per step kind, the operators per GDN layer and the host syncs per step
(``aten._local_scalar_dense`` / ``nonzero`` / ``masked_select`` / ``item`` inside the
layers), and the tokens per decode step each variant produced. The counts are
hardware-independent; on an NPU each counted call is one kernel launch.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict

from emulated_child import run_child

VARIANTS = ("plain", "ngram-3")
SYNC_OPS = ("aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.item")


def child(variant: str, prompts: int, max_tokens: int) -> dict:
    from vllm import LLM, SamplingParams

    from vllm_ascend_ext.attention.gdn.builder import AscendGdnMetadataBuilder
    from vllm_ascend_ext.models import tiny_qwen3_next_path
    from vllm_ascend_ext.ops.counting import OpCounter

    kwargs = {}
    if variant != "plain":
        kwargs["speculative_config"] = {"method": "ngram", "num_speculative_tokens": 3,
                                        "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    llm = LLM(model=tiny_qwen3_next_path(), dtype="float32", seed=0, max_model_len=512,
              **kwargs)
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    layers = sum(1 for m in runner.model.modules() if type(m).__name__ == "AscendGatedDeltaNet")
    words = "one two three four five six seven eight".split()
    ps = [" ".join(words[(i + j) % len(words)] for j in range(40)) for i in range(prompts)]
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    with OpCounter(steps_of=AscendGdnMetadataBuilder) as counter:
        outs = llm.generate(ps, sp, use_tqdm=False)
    kinds: dict[str, list] = defaultdict(list)
    for step in counter.steps[1:]:
        if not step.in_layers:  # one bucket per KV-cache group's build; layers run after all
            continue
        kinds[step.kind].append({"ops": dict(step.in_layers),
                                 "syncs": sum(step.in_layers.get(n, 0) for n in SYNC_OPS)})
    decode_steps = sum(len(v) for k, v in kinds.items() if "prefill" not in k)
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"layers": layers, "kinds": kinds, "decode_steps": decode_steps, "tokens": tokens,
            "prompts": prompts}


def table(results: dict) -> str:
    lines = [f"{'variant':<9} {'step kind':<15} {'steps':>5} {'ops/layer':>9} "
             f"{'npu ops/layer':>13} {'syncs/step':>10}  top ops per layer"]
    for variant, r in results.items():
        for kind, steps in sorted(r["kinds"].items()):
            total = Counter()
            for s in steps:
                total.update(s["ops"])
            per = {k: v / len(steps) / r["layers"] for k, v in total.items()}
            npu = sum(v for k, v in per.items() if k.startswith(("npu_", "_C_ascend_ext")))
            syncs = sum(s["syncs"] for s in steps) / len(steps)
            top = ", ".join(f"{k} {v:.0f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1])[:4])
            lines.append(f"{variant:<9} {kind:<15} {len(steps):>5} {sum(per.values()):>9.1f} "
                         f"{npu:>13.1f} {syncs:>10.1f}  {top}")
    lines.append("")
    for variant, r in results.items():
        lines.append(f"{variant:<9} decode/verify steps {r['decode_steps']:>4}, generated tokens "
                     f"{r['tokens']} over {r['prompts']} prompts")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--child")
    args = p.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.prompts, args.max_tokens)))
        return
    results = {variant: run_child(__file__, variant, "--prompts", str(args.prompts), "--max-tokens",
                                 str(args.max_tokens))
               for variant in VARIANTS}
    print(table(results))


if __name__ == "__main__":
    main()
