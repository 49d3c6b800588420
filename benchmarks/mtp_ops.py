"""Operators per decode step: plain decoding vs MTP speculation, per backend.

    python benchmarks/mtp_ops.py [--prompts 4] [--max-tokens 32] [--models qwen3-next,mimo,dsa]

Serves each embedded tiny model with its MTP layer (emulated A2, fp32, real vLLM, eager so
that every launch is counted), plain and with MTP k = 1 (and k = 3 for Qwen3-Next), in one
subprocess per variant:

* ``qwen3-next``: FIA + the plugin's Gated-DeltaNet layers (3 GDN + 1 full-attention layer);
* ``mimo``: FIA only (a dense GQA model, 2 layers; on an NPU its verify steps replay decode
  graphs, here counted eager);
* ``dsa``: SFA with the lightning indexer (W8A8, DeepSeek-V3.2-style, 2 layers).

Every operator of each engine step is counted at the dispatcher level (``ops/counting.py``:
plugin NPU operators once each, their references opaque, views not counted): the target's
forward, the rejection sampler, the drafter's input kernels (the NPU substitutes) and the
MTP layer's forward(s). A step is one call of the runner's ``execute_model`` and what
follows until the next (sampling and drafting included); a decode step is one whose every
request has only its verified token and its drafts scheduled. Prints per variant: decode
steps, ATen + NPU operators per step, attention layer calls per step (FIA layer calls or
SFA sparse-attention calls: the target's layers and the MTP layer), GDN operators per
step, host syncs inside the attention layers per step (the plugin's layer entries: GDN,
SFA), and generated tokens per request per step. The tiny MTP layers are untrained (they agree with
their model in a few percent of drafts), so tokens per step stay near 1 here: the table
is the cost side of MTP; the acceptance a trained MTP layer brings sets the other side.
"""

from __future__ import annotations

import argparse
import json

from emulated_child import run_child

# model -> its variants (the model is a tiny-model-path name; dsa: its W8A8 one)
MODELS = {"qwen3-next": ("plain", "mtp-1", "mtp-3"), "mimo": ("plain", "mtp-1"),
          "dsa": ("plain", "mtp-1")}
SYNC_OPS = ("aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.item")
FIA = "vllm.unified_attention_with_output"   # one full-attention (FIA) layer call
SFA = "npu_sparse_flash_attention"           # one SFA layer call (its attention op)


def _is_decode(sched, runner) -> bool:
    """Every scheduled request is past its prompt and runs only its verified token and its
    drafts (host facts of the scheduler's output; nothing read from the device)."""
    if sched.scheduled_new_reqs or not sched.num_scheduled_tokens:
        return False
    cached = sched.scheduled_cached_reqs
    computed = dict(zip(cached.req_ids, cached.num_computed_tokens))
    for rid, n in sched.num_scheduled_tokens.items():
        state = runner.requests.get(rid)
        if (state is None or computed.get(rid, 0) < len(state.prompt_token_ids or ())
                or n != 1 + len(sched.scheduled_spec_decode_tokens.get(rid, ()))):
            return False
    return True


def child(model: str, variant: str, prompts: int, max_tokens: int) -> dict:
    from vllm import LLM, SamplingParams

    from vllm_ascend_ext.cli.plugin_commands import _tiny_paths
    from vllm_ascend_ext.ops.counting import OpCounter

    kwargs = {}
    if variant != "plain":
        kwargs["speculative_config"] = {"method": "mtp",
                                        "num_speculative_tokens": int(variant.split("-")[1])}
    path = _tiny_paths()["dsa-w8a8" if model == "dsa" else model]()
    llm = LLM(model=path, dtype="float32", seed=0, max_model_len=512, enforce_eager=True,
              disable_log_stats=False, **kwargs)
    words = "one two three four five six seven eight".split()
    ps = [" ".join(words[(i + j) % len(words)] for j in range(24)) for i in range(prompts)]
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    counter = OpCounter()
    execute = runner.execute_model

    def counted_execute(sched, *args, **kwargs):   # one bucket per engine step
        counter.new_step("decode" if _is_decode(sched, runner) else "other")
        return execute(sched, *args, **kwargs)
    runner.execute_model = counted_execute
    with counter:
        outs = llm.generate(ps, sp, use_tqdm=False)
    steps = [b for b in counter.steps if b.ops]
    decode = [b for b in steps if b.kind == "decode"]
    metrics = {m.name: getattr(m, "value", None)
               for m in llm.get_metrics() if m.name.startswith("vllm:spec_decode")}
    return {"decode_steps": len(decode),
            "ops": [sum(b.ops.values()) for b in decode],
            "npu": [sum(v for k, v in b.ops.items() if k.startswith(("npu_", "_C_ascend_ext")))
                    for b in decode],
            "attn": [b.ops.get(FIA, 0) + b.ops.get(SFA, 0) for b in decode],
            "gdn": [sum(v for k, v in b.in_layers.items()
                        if "gated_delta" in k or "causal_conv1d" in k) for b in decode],
            "syncs": [sum(b.in_layers.get(n, 0) for n in SYNC_OPS) for b in decode],
            "tokens": sum(len(o.outputs[0].token_ids) for o in outs),
            "other_steps": len(steps) - len(decode), "prompts": prompts,
            "accepted": metrics.get("vllm:spec_decode_num_accepted_tokens"),
            "draft_tokens": metrics.get("vllm:spec_decode_num_draft_tokens")}


def table(results: dict) -> str:
    def mean(xs):
        return sum(xs) / len(xs) if xs else 0.0

    lines = [f"{'model':<10} {'variant':<7} {'steps':>5} {'ops/step':>9} {'x plain':>7} "
             f"{'npu/step':>8} {'attn layer calls/step':>21} {'GDN/step':>8} "
             f"{'syncs/step':>10} {'tokens/req/step':>15} {'accepted':>12}"]
    for (model, variant), r in results.items():
        base = mean(results[(model, "plain")]["ops"])
        n = r["decode_steps"]
        decode_tokens = r["tokens"] - r["prompts"]   # each prompt's first token: its prefill
        acc = ("-" if r["draft_tokens"] is None
               else f"{r['accepted']}/{r['draft_tokens']}")
        lines.append(f"{model:<10} {variant:<7} {n:>5} {mean(r['ops']):>9.0f} "
                     f"{mean(r['ops']) / base:>7.2f} {mean(r['npu']):>8.1f} "
                     f"{mean(r['attn']):>21.1f} {mean(r['gdn']):>8.1f} {mean(r['syncs']):>10.1f} "
                     f"{decode_tokens / max(n, 1) / r['prompts']:>15.2f} {acc:>12}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--child")
    args = p.parse_args()
    if args.child:
        model, variant = args.child.split(":")
        print("RESULT " + json.dumps(child(model, variant, args.prompts, args.max_tokens)))
        return
    results = {(model, variant): run_child(__file__, f"{model}:{variant}", "--prompts",
                                           str(args.prompts), "--max-tokens",
                                           str(args.max_tokens))
               for model in args.models.split(",") for variant in MODELS[model]}
    print(table(results))


if __name__ == "__main__":
    main()
