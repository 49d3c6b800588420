"""Run the embedded tiny model offline and print one JSON line of results.

    python tests/e2e/run_llm.py [--corrupt-block-table] [--max-tokens N] [--enforce-eager]
                                [--skip-graph-update] [--model mimo --mtp K [--oracle FILE RATE]]

``--mtp K``: MTP speculation with K drafts on the tiny MiMo model (its own MTP layer;
``--oracle FILE RATE``: a deterministic RATE of the proposals replaced by FILE's plain
continuation, see ``spec_harness.py``); ``--ragged``: request lengths differ.

The platform is whatever vLLM selects in this process (set ASCEND_EXT_EMULATE=1
for the plugin). Used by the e2e tests, in a subprocess per platform, because
vLLM resolves its platform once per process.
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from spec_harness import (  # noqa: E402
    corrupt_fia_verify_slot,
    count_substitutes,
    oracle_drafts,
    spec_result,
)

PROMPTS = [
    "the quick brown fox jumps over the lazy dog and then",
    "attention is computed over keys and values stored in a paged cache",
    "numbers like 1 2 3",
    "a decode step reads every cached token of its request, while a prefill chunk "
    "attends causally to the prefix and to itself; ascend npus run fused kernels",
]


def corrupt_block_table() -> None:
    """Negative control: every request reads the next request's KV blocks."""
    import dataclasses

    from vllm_ascend_ext.attention.fia import builder as fia_builder

    original = fia_builder.AscendFIAMetadataBuilder.build

    def build(self, *args, **kwargs):
        md = original(self, *args, **kwargs)
        return dataclasses.replace(md, block_table=md.block_table.roll(1, dims=0))

    fia_builder.AscendFIAMetadataBuilder.build = build


def skip_graph_update() -> None:
    """Negative control: decode graphs replay without the FIA graph-task update (each FIA
    task keeps the host lists of its capture step)."""
    from vllm_ascend_ext.worker import npu_graph

    npu_graph.update_before_replay = lambda attn_metadata, key: 0


def observe_replays(corrupt: bool = False) -> list:
    """Observation: per graph replay, the graph's tokens and the step's query lengths (the
    FIA metadata's host lists, before the padding requests take the graph's rest).
    ``corrupt`` (negative control): the graph-task update gives every real request one KV
    position too many, in replays only (eager steps keep their lists)."""
    import dataclasses

    from vllm_ascend_ext.attention.fia.graph_tasks import _step_lists
    from vllm_ascend_ext.worker import npu_graph

    seen = []
    original = npu_graph.update_before_replay

    def update(attn_metadata, key):
        for _, lists in _step_lists(attn_metadata or {}):
            ends = (0,) + tuple(lists["actual_seq_lengths"])
            seen.append({"graph_tokens": getattr(key, "num_tokens", None),
                         "q_lens": [b - a for a, b in zip(ends, ends[1:])]})
            break
        if corrupt and isinstance(attn_metadata, dict):
            attn_metadata = {name: dataclasses.replace(md, actual_seq_lengths_kv=tuple(
                n + 1 if n else n for n in md.actual_seq_lengths_kv))
                if hasattr(md, "actual_seq_lengths_kv") else md
                for name, md in attn_metadata.items()}
        return original(attn_metadata, key)
    npu_graph.update_before_replay = update
    return seen


def vllm_cpu_kernels() -> None:
    """The reference run of the rejection sampler's substitutes: vLLM's own C++ kernels for
    the CPU (what its CPU platform registers for the same Triton kernels) in place of the
    NPU's substitutes, on the same engine path: the same draws, so any difference is the
    substitutes'. The expand kernel keeps the NPU's substitute: vLLM's C++ one reads the
    GPU runner's int32 top-k as another type (garbage indices)."""
    from vllm.utils import cpu_triton_utils as cpu_tl

    from vllm_ascend_ext.worker import kernel_substitutes as ks

    rs = "vllm.v1.sample.rejection_sampler."
    for name, impl in {rs + "rejection_greedy_sample_kernel": "_rejection_greedy_sample_kernel_impl",
                       rs + "rejection_random_sample_kernel": "_rejection_random_sample_kernel_impl",
                       rs + "sample_recovered_tokens_kernel":
                           "_sample_recovered_tokens_kernel_impl"}.items():
        assert name in ks.SUBSTITUTES, name
        ks.SUBSTITUTES[name] = getattr(cpu_tl, impl)


def break_substitute(which: str) -> None:
    """Negative control: one of the NPU's substitutes of vLLM's Triton kernels
    (worker/kernel_substitutes.py) made wrong the way a faulty port would be."""
    import torch

    from vllm_ascend_ext.worker import kernel_substitutes as ks

    rs = "vllm.v1.sample.rejection_sampler."
    name = {"greedy": rs + "rejection_greedy_sample_kernel",
            "random": rs + "rejection_random_sample_kernel", "expand": rs + "expand_kernel",
            "recovered": rs + "sample_recovered_tokens_kernel",
            "slot_mapping": ks.SLOT_MAPPING}[which]
    good = ks.SUBSTITUTES[name]

    def greedy(output, cu, draft, target_argmax, *args, **kwargs):      # accepts every draft
        good(output, cu, draft, draft.to(target_argmax.dtype), *args, **kwargs)

    def random(*args, **kwargs):                      # accepts every draft (uniform 0)
        args = list(args)
        args[7] = args[7].new_zeros(args[7].shape)
        good(*args, **kwargs)

    def expand(output, input, *args, **kwargs):       # each request gets its neighbour's value
        good(output, input.roll(1), *args, **kwargs)

    def recovered(output_token_ids, *args, **kwargs):  # the recovered token is always 0
        good(output_token_ids, *args, **kwargs)
        output_token_ids.zero_()

    def slot_mapping(*args, **kwargs):                 # every token one slot further
        good(*args, **kwargs)
        slots = args[6]
        slots.copy_(torch.where(slots >= 0, slots + 1, slots))

    ks.SUBSTITUTES[name] = {"greedy": greedy, "random": random, "expand": expand,
                            "recovered": recovered, "slot_mapping": slot_mapping}[which]


def corrupt_moe_routing() -> None:
    """Negative control: MoE routing weights left unnormalised (norm_topk_prob ignored)."""
    import dataclasses

    from vllm_ascend_ext.moe import experts

    original = experts.route

    def route(plan, router_logits, bias):
        return original(dataclasses.replace(plan, renormalize=not plan.renormalize),
                        router_logits, bias)

    experts.route = route


def _moe_methods(llm) -> list[str]:
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    return sorted({type(m.quant_method).__name__ for m in runner.model.modules()
                   if "MoE" in type(getattr(m, "quant_method", None)).__name__})


def _builders(llm):
    """The in-process engine's attention metadata builders (test helper)."""
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    return [b for g in runner._attn_group_iterator() for b in g.metadata_builders]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corrupt-block-table", action="store_true")
    ap.add_argument("--max-tokens", type=int, default=12)
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--max-num-batched-tokens", type=int, default=None)
    ap.add_argument("--mixed-split", default=None, help="ascend_ext.mixed_split value")
    ap.add_argument("--ngram", action="store_true", help="ngram speculation, 3 draft tokens")
    ap.add_argument("--many", action="store_true", help="32 prompts of varied length")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--model", choices=("qwen3", "qwen_moe", "mimo"), default="qwen3")
    ap.add_argument("--mtp", type=int, default=0, help="MTP speculation with this many drafts")
    ap.add_argument("--oracle", nargs=2, metavar=("PLAIN_RESULT", "RATE"))
    ap.add_argument("--ragged", action="store_true",
                    help="max_tokens differ across requests (some finish mid-draft)")
    ap.add_argument("--corrupt-moe-routing", action="store_true")
    ap.add_argument("--skip-graph-update", action="store_true")
    ap.add_argument("--corrupt-verify-slot", action="store_true")
    ap.add_argument("--corrupt-replay-lists", action="store_true")
    ap.add_argument("--break-substitute", default=None,
                    choices=("greedy", "random", "expand", "recovered", "slot_mapping"))
    ap.add_argument("--vllm-cpu-kernels", action="store_true",
                    help="vLLM's C++ CPU kernels in place of the NPU's Triton substitutes")
    ap.add_argument("--sample", action="store_true",
                    help="random sampling: temperatures 0.6-1.2 across requests, a seed each")
    ap.add_argument("--gpu-memory-utilization", type=float, default=None,
                    help="size the KV cache by the worker's memory profiling")
    args = ap.parse_args()
    if args.corrupt_block_table:
        corrupt_block_table()
    if args.corrupt_moe_routing:
        corrupt_moe_routing()
    if args.skip_graph_update:
        skip_graph_update()
    if args.corrupt_verify_slot:
        corrupt_fia_verify_slot()
    replays = observe_replays(corrupt=args.corrupt_replay_lists)
    if args.oracle and not args.mtp:
        raise SystemExit("--oracle replaces MTP proposals: give --mtp K")
    if args.break_substitute:
        break_substitute(args.break_substitute)
    if args.vllm_cpu_kernels:
        vllm_cpu_kernels()

    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    from vllm_ascend_ext.models import tiny_mimo_path, tiny_model_path, tiny_qwen_moe_path

    kwargs = {}
    if args.gpu_memory_utilization:   # the worker's profiling sizes the KV cache
        os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
        kwargs["gpu_memory_utilization"] = args.gpu_memory_utilization
    if args.mixed_split:
        kwargs["additional_config"] = {"ascend_ext": {"mixed_split": args.mixed_split}}
    if args.ngram:
        kwargs["speculative_config"] = {"method": "ngram", "num_speculative_tokens": 3,
                                        "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    if args.mtp:
        kwargs["speculative_config"] = {"method": "mtp", "num_speculative_tokens": args.mtp}
        kwargs["disable_log_stats"] = False
    substitute_calls = count_substitutes() if args.mtp else {}
    if args.max_num_batched_tokens:
        kwargs.update(max_num_batched_tokens=args.max_num_batched_tokens,
                      enable_chunked_prefill=True)
    model = {"qwen_moe": tiny_qwen_moe_path, "mimo": tiny_mimo_path,
             "qwen3": tiny_model_path}[args.model]()
    llm = LLM(model=model, dtype=args.dtype, seed=0, max_model_len=1024,
              enforce_eager=args.enforce_eager, **kwargs)
    ctx = llm.llm_engine.vllm_config.compilation_config.static_forward_context
    backends = sorted({type(layer.attn_backend).__name__ if not isinstance(layer.attn_backend, type)
                       else layer.attn_backend.get_name()
                       for layer in ctx.values() if hasattr(layer, "attn_backend")})
    sp = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, logprobs=1, ignore_eos=True)
    prompts = PROMPTS
    if args.many:  # 32 prompts of varied length, with repeats so ngram drafts hit
        import random

        rng = random.Random(0)
        words = " ".join(PROMPTS).split()
        prompts = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 60))) * 2
                   for _ in range(32)]
    if args.sample:   # each request its own temperature and seed: reproducible sampling
        # (every other request also filtered by top-k and top-p: the sampler's filter)
        sp = [SamplingParams(max_tokens=args.max_tokens, temperature=0.6 + 0.2 * (i % 4),
                             seed=1000 + i, logprobs=1, ignore_eos=True,
                             **({"top_k": 5 + i, "top_p": 0.9} if i % 2 else {}))
              for i in range(len(prompts))]
    if args.ragged:     # 12 / 9 / 6 ... tokens: requests finish at different steps
        assert args.max_tokens > 6 and not args.sample, "--ragged: greedy, --max-tokens > 6"
        sp = [SamplingParams(max_tokens=args.max_tokens - 3 * (i % 3), temperature=0.0,
                             logprobs=1, ignore_eos=True) for i in range(len(prompts))]
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    # the sampler's npu_top_k_top_p calls before any request (vLLM's warm-ups)
    fused_at_start = getattr(runner.sampler.topk_topp_sampler, "fused_calls", None)
    oracle = None
    if args.oracle:
        oracle = oracle_drafts(runner, args.oracle[0], float(args.oracle[1]))
    outs = llm.generate(prompts, sp, use_tqdm=False)
    stats = [b.stats for b in _builders(llm) if hasattr(b, "stats")]

    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    result = {
        "platform": type(current_platform).__name__,
        "registered": "ASCEND_EXT_FIA" in AttentionBackendEnum.__members__,
        "backends": backends,
        "split_stats": [{"mixed": st.mixed, "split": st.split, "declined": dict(st.declined)}
                        for st in stats],
        "moe_methods": _moe_methods(llm),
        "num_attention_layers": sum(1 for v in ctx.values() if hasattr(v, "attn_backend")),
        "prompt_token_ids": [list(o.prompt_token_ids) for o in outs],
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "logprobs": [[lp[t].logprob for t, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)]
                     for o in outs],
    }
    from engine_info import engine_info

    result["engine"] = engine_info(llm)
    result["top_k_top_p_fused_at_start"] = fused_at_start
    result["replays"] = replays
    if args.mtp:
        result.update(spec_result(llm, runner, substitute_calls, oracle))
    from vllm_ascend_ext.contract import mode

    if mode.enabled():  # this process ran every NPU call (uni executor)
        h = mode.harness()
        result["contract"] = {"calls": dict(h.calls), "violations": h.violations,
                              "summary": h.summary()}
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
