"""Hybrid prefix caching: prefill tokens computed and state copies, caching off vs on.

    python benchmarks/gdn_prefix_caching.py [--families 3] [--followers 3] [--max-tokens 8]

Runs the embedded tiny Qwen3-Next (3 Gated-DeltaNet + 1 full-attention layer; emulated
A2, fp32, real vLLM, block size 128) in a subprocess per variant: prefix caching off,
on (vLLM's align mode on the plugin's GDN layers), and on with ngram speculation (3
drafts). The workload is a chat/agent pattern in two waves: ``--families`` system prompts
of about five blocks; wave 1 sends one request per family, wave 2 ``--followers`` more per
family, half asking another question after the shared system prompt and half continuing
wave 1's conversation (its prompt plus a new turn). Per variant and wave it prints the
prompt tokens, the tokens vLLM served from the prefix cache (its per-request
``num_cached_tokens``, and its ``vllm:prefix_cache_hits`` / ``queries`` counters over the
run), the prefill tokens computed, their ratio to caching off, and the state copies the
NPU runner issued (``batch_memcpy`` copies and bytes; rows whose state the speculative
pre/post copies moved). Token counts and copies are hardware-independent; the emulated seconds are the
CPU's, shown only beside each other.
"""

from __future__ import annotations

import argparse
import json
import random
import time

from emulated_child import run_child

VARIANTS = ("off", "on", "on+ngram")
VOCAB = 1024


def workload(families: int, followers: int, block: int) -> list[list[list[int]]]:
    rng = random.Random(11)

    def text(n: int) -> list[int]:
        phrase = [rng.randrange(4, VOCAB) for _ in range(rng.randrange(5, 12))]
        return (phrase * (n // len(phrase) + 1))[:n]

    systems = [text(5 * block + rng.randrange(0, block)) for _ in range(families)]
    first = [s + text(rng.randrange(20, 90)) for s in systems]
    second = []
    for s, f in zip(systems, first):
        for i in range(followers):
            second.append((f if i % 2 else s) + text(rng.randrange(20, 90)))
    return [first, second]


def child(variant: str, families: int, followers: int, max_tokens: int) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from vllm_ascend_ext.models import tiny_qwen3_next_path
    from vllm_ascend_ext.worker import mamba_spec_copies, mamba_state_copy

    copies = {"batch_memcpy": 0, "bytes": 0, "spec_rows": 0}
    locate, spec_copy = mamba_state_copy.StateMemory.locate, mamba_spec_copies.AlignSpecCopies._copy

    def counted(self, address, size):
        copies["batch_memcpy"] += 0.5          # two addresses per copy
        copies["bytes"] += size / 2
        return locate(self, address, size)

    def spec_counted(self, rows, src_col, dst_col, bias, need, width):
        copies["spec_rows"] += int((need & ((dst_col != src_col) | (bias != 0))).sum())
        return spec_copy(self, rows, src_col, dst_col, bias, need, width)
    mamba_state_copy.StateMemory.locate = counted
    mamba_spec_copies.AlignSpecCopies._copy = spec_counted

    kwargs = {}
    if variant.endswith("ngram"):
        kwargs["speculative_config"] = {"method": "ngram", "num_speculative_tokens": 3,
                                        "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    llm = LLM(model=tiny_qwen3_next_path(), dtype="float32", seed=0, max_model_len=2048,
              max_num_batched_tokens=256, max_num_seqs=16, enforce_eager=True,
              enable_prefix_caching=variant != "off", disable_log_stats=False, **kwargs)
    cache = llm.llm_engine.vllm_config.cache_config
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    waves = []
    for prompts in workload(families, followers, cache.block_size):
        before = dict(copies)
        t0 = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp,
                            use_tqdm=False)
        waves.append({"seconds": time.perf_counter() - t0,
                      "prompt_tokens": sum(len(p) for p in prompts),
                      "cached": sum(o.num_cached_tokens or 0 for o in outs),
                      "tokens": [list(o.outputs[0].token_ids) for o in outs],
                      **{k: copies[k] - before[k] for k in copies}})
    metrics = {m.name: m.value for m in llm.get_metrics()
               if m.name in ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries")}
    return {"block_size": cache.block_size, "mode": cache.mamba_cache_mode, "waves": waves,
            "metrics": metrics}


def table(results: dict) -> str:
    off = results["off"]
    lines = [f"{'variant':<9} {'wave':>4} {'prompt tok':>10} {'cached':>7} {'computed':>8} "
             f"{'vs off':>6} {'copies':>6} {'copy KiB':>8} {'spec rows':>9} {'s (CPU)':>7}"]
    for variant, r in results.items():
        for i, w in enumerate(r["waves"]):
            computed = w["prompt_tokens"] - w["cached"]
            base = off["waves"][i]["prompt_tokens"] - off["waves"][i]["cached"]
            lines.append(f"{variant:<9} {i + 1:>4} {w['prompt_tokens']:>10} {w['cached']:>7} "
                         f"{computed:>8} {computed / base:>6.2f} {int(w['batch_memcpy']):>6} "
                         f"{w['bytes'] / 1024:>8.1f} {w['spec_rows']:>9} {w['seconds']:>7.2f}")
    lines.append("")
    for variant, r in results.items():
        m = r["metrics"]
        same = all(w["tokens"] == o["tokens"] for w, o in zip(r["waves"], off["waves"]))
        lines.append(f"{variant:<9} mode {r['mode']}, block {r['block_size']}: vLLM prefix-cache "
                     f"hits {m.get('vllm:prefix_cache_hits', 0):.0f} of "
                     f"{m.get('vllm:prefix_cache_queries', 0):.0f} queried tokens; greedy "
                     f"tokens {'identical to' if same else 'DIFFER from'} caching off")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--families", type=int, default=3)
    p.add_argument("--followers", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--child")
    args = p.parse_args()
    sizes = (args.families, args.followers, args.max_tokens)
    if args.child:
        print("RESULT " + json.dumps(child(args.child, *sizes)))
        return
    results = {variant: run_child(__file__, variant, "--families", str(args.families), "--followers",
                                 str(args.followers), "--max-tokens", str(args.max_tokens))
               for variant in VARIANTS}
    print(table(results))


if __name__ == "__main__":
    main()
