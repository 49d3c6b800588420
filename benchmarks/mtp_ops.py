"""Operators per decode step: plain decoding vs MTP speculation (k = 1 and 3), per backend.

    python benchmarks/mtp_ops.py [--prompts 4] [--max-tokens 32]

Serves the embedded tiny Qwen3-Next with its MTP layer (3 Gated-DeltaNet + 1 full-attention
layer, 1 MTP layer; emulated A2, fp32, real vLLM, eager: the hybrid model runs without
graphs) in one subprocess per variant, and counts every operator of each decode step at the
dispatcher level (``ops/counting.py``: plugin NPU operators once each, their references
opaque, views not counted): the target's forward, the rejection sampler, the drafter's
input kernels (the NPU substitutes) and the MTP layer's forward(s). Prints per variant:
engine decode steps, ATen + NPU operators per step, full-attention layer calls per step (the FIA
backend: the target's layer and the MTP layer), GDN operators per step (the plugin's conv and
recurrence), host syncs inside the attention layers per step, and generated tokens per
step. The tiny MTP layer is untrained (it agrees with the model in a few percent of
drafts), so tokens per step stay near 1 here: the table is the cost side of MTP; the
acceptance a trained MTP layer brings sets the other side. DeepSeek-V3.2 (SFA) MTP is
served too (``tests/e2e/test_sfa_mtp_engine.py``) but not in this table yet: the SFA
builder labels verify steps by query length, so its decode steps need another bucketing.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

from emulated_child import run_child

VARIANTS = ("plain", "mtp-1", "mtp-3")
SYNC_OPS = ("aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.item")
FIA = "vllm.unified_attention_with_output"   # one full-attention (FIA) layer call


def child(variant: str, prompts: int, max_tokens: int) -> dict:
    from vllm import LLM, SamplingParams

    from vllm_ascend_ext.attention.gdn.builder import AscendGdnMetadataBuilder
    from vllm_ascend_ext.models import tiny_qwen3_next_path
    from vllm_ascend_ext.ops.counting import OpCounter

    kwargs = {}
    if variant != "plain":
        kwargs["speculative_config"] = {"method": "mtp",
                                        "num_speculative_tokens": int(variant.split("-")[1])}
    llm = LLM(model=tiny_qwen3_next_path(), dtype="float32", seed=0, max_model_len=512,
              disable_log_stats=False, **kwargs)
    words = "one two three four five six seven eight".split()
    ps = [" ".join(words[(i + j) % len(words)] for j in range(24)) for i in range(prompts)]
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    with OpCounter(steps_of=AscendGdnMetadataBuilder) as counter:
        outs = llm.generate(ps, sp, use_tqdm=False)
    # One bucket per KV-cache group's build; a step's operators land in its last bucket,
    # so a step is a bucket whose layers ran. Decode steps: no prompt token in them.
    steps, current = [], None
    for bucket in counter.steps[1:]:
        if current is None:
            current = {"kind": bucket.kind, "ops": Counter(), "layers": Counter()}
        current["ops"].update(bucket.ops)
        current["layers"].update(bucket.in_layers)
        if bucket.in_layers:
            steps.append(current)
            current = None
    decode = [s for s in steps if "prefill" not in s["kind"]]
    metrics = {m.name: getattr(m, "value", None)
               for m in llm.get_metrics() if m.name.startswith("vllm:spec_decode")}
    return {"decode_steps": len(decode),
            "ops": [sum(s["ops"].values()) for s in decode],
            "npu": [sum(v for k, v in s["ops"].items() if k.startswith(("npu_", "_C_ascend_ext")))
                    for s in decode],
            "fia": [s["ops"].get(FIA, 0) for s in decode],
            "gdn": [sum(v for k, v in s["layers"].items()
                        if "gated_delta" in k or "causal_conv1d" in k) for s in decode],
            "syncs": [sum(s["layers"].get(n, 0) for n in SYNC_OPS) for s in decode],
            "tokens": sum(len(o.outputs[0].token_ids) for o in outs),
            "prefill_steps": len(steps) - len(decode), "prompts": prompts,
            "accepted": metrics.get("vllm:spec_decode_num_accepted_tokens"),
            "draft_tokens": metrics.get("vllm:spec_decode_num_draft_tokens")}


def table(results: dict) -> str:
    def mean(xs):
        return sum(xs) / len(xs) if xs else 0.0

    base = mean(results["plain"]["ops"])
    lines = [f"{'variant':<7} {'steps':>5} {'ops/step':>9} {'x plain':>7} {'npu/step':>8} "
             f"{'FIA layer calls/step':>20} {'GDN/step':>8} {'syncs/step':>10} {'tokens/req/step':>15} "
             f"{'accepted':>12}"]
    for variant, r in results.items():
        n = r["decode_steps"]
        decode_tokens = r["tokens"] - r["prompts"]   # each prompt's first token: its prefill
        acc = ("-" if r["draft_tokens"] is None
               else f"{r['accepted']}/{r['draft_tokens']}")
        lines.append(f"{variant:<7} {n:>5} {mean(r['ops']):>9.0f} {mean(r['ops']) / base:>7.2f} "
                     f"{mean(r['npu']):>8.1f} {mean(r['fia']):>20.1f} {mean(r['gdn']):>8.1f} "
                     f"{mean(r['syncs']):>10.1f} {decode_tokens / max(n, 1) / r['prompts']:>15.2f} {acc:>12}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--child")
    args = p.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.prompts, args.max_tokens)))
        return
    results = {variant: run_child(__file__, variant, "--prompts", str(args.prompts),
                                  "--max-tokens", str(args.max_tokens))
               for variant in VARIANTS}
    print(table(results))


if __name__ == "__main__":
    main()
