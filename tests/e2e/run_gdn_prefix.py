"""Hybrid prefix caching (vLLM's "align" mode) on the embedded tiny Qwen3-Next, emulated;
prints one ``RESULT {json}`` line.

    python tests/e2e/run_gdn_prefix.py [--caching on|off] [--dtype float32] [--spec]
                                       [--corrupt neighbour-block]

The workload: two request families in two waves (``first_wave``, ``second_wave``). Wave 1
serves one request per family, wave 2 (after wave 1 finished) four more whose prefixes
are wave 1's: two questions after A's shared system prompt, two next turns of
conversation B (its prompt and its answer, which crossed a block boundary while
decoding), so with caching on they resume from the checkpoints wave 1 left, at a prompt's
last full block and at a block completed while decoding. A small token budget cuts the
prompts into chunks that continue a state.
``--spec``: ngram speculation with 3 drafts. ``--mixed-split on``: the full-attention
layer splits its mixed prefill/decode steps (reported as ``split``). ``--variant JSON``: a checkpoint of another
configuration (``make_tiny_qwen3_next.save_variant``), e.g. every expert taken, so that
bf16 runs have no routing near-ties. ``--corrupt neighbour-block``: the negative
control, a test-only patch: every state copy across a block boundary reads the
neighbouring (previous) block's checkpoint instead of the request's own.
"""

from __future__ import annotations

import argparse
import json
import os
import random

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

VOCAB = 1024


def text_maker(seed: int = 7):
    """Token-id text of ``n`` tokens: a random phrase repeated (ngram speculation finds
    drafts in it)."""
    rng = random.Random(seed)

    def text(n: int) -> list[int]:
        phrase = [rng.randrange(4, VOCAB) for _ in range(rng.randrange(5, 12))]
        return (phrase * (n // len(phrase) + 1))[:n]
    return text


def first_wave(block: int, text) -> tuple[list[int], list[int]]:
    """Family A: a prefix of four blocks plus 17 tokens (a system prompt), then its own
    question; family B: a conversation ending 5 tokens before a block boundary, so that its
    answer crosses it while decoding."""
    return text(4 * block + 17), text(4 * block - 5)


def second_wave(block: int, text, a: list[int], b: list[int],
                b_answer: list[int]) -> list[list[int]]:
    """Two more questions after A's system prompt; two next turns of conversation B (its
    prompt, its answer, a new message). vLLM's align mode keeps the checkpoint of a
    prompt's last full block and the blocks a request completes while decoding."""
    return [a + text(block - 25), a + text(9), b + b_answer + text(block // 2 + 3),
            b + b_answer + text(block - 38)]


def corrupt(kind: str) -> None:
    from vllm.v1.worker import mamba_utils

    if kind != "neighbour-block":
        raise SystemExit(f"unknown --corrupt {kind}")
    original = mamba_utils.collect_mamba_copy_meta

    def neighbour(copy_bufs, kv_cache_config, funcs, group_ids, src_block_idx, *rest):
        return original(copy_bufs, kv_cache_config, funcs, group_ids,
                        max(src_block_idx - 1, 0), *rest)
    mamba_utils.collect_mamba_copy_meta = neighbour


def observe_copies() -> dict:
    """Which implementation vLLM's state-copy kernels dispatch to, and what the NPU runner's
    copies did (observation only: wraps, changes nothing; the device reads are the CPU's)."""
    from vllm_ascend_ext.worker import mamba_spec_copies, mamba_state_copy

    seen = {"batch_memcpy": 0, "precopy_rows": 0, "postcopy_rows": 0}
    locate = mamba_state_copy.StateMemory.locate

    def counted(self, address, size):
        seen["batch_memcpy"] += 1
        return locate(self, address, size)
    mamba_state_copy.StateMemory.locate = counted
    cls = mamba_spec_copies.AlignSpecCopies
    pre, post, copy = cls.run_fused_precopy, cls.run_fused_postprocess, cls._copy
    phase = {"now": None}

    def copy_counted(self, rows, src_col, dst_col, bias, need, width):
        # rows that really move state (not the identity writes of a row staying put)
        seen[phase["now"]] += int((need & ((dst_col != src_col) | (bias != 0))).sum())
        return copy(self, rows, src_col, dst_col, bias, need, width)

    def in_phase(name, fn):
        def run(self, *args, **kwargs):
            phase["now"] = name
            return fn(self, *args, **kwargs)
        return run
    cls._copy = copy_counted
    cls.run_fused_precopy = in_phase("precopy_rows", pre)
    cls.run_fused_postprocess = in_phase("postcopy_rows", post)
    return seen


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--caching", choices=("on", "off"), default="on")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--spec", action="store_true")
    p.add_argument("--budget", type=int, default=96)
    p.add_argument("--max-tokens", type=int, default=12)
    p.add_argument("--corrupt")
    p.add_argument("--variant", help="JSON overrides of the embedded model's config")
    p.add_argument("--mixed-split", default="auto", help="ascend_ext.mixed_split value")
    args = p.parse_args()
    if args.corrupt:
        corrupt(args.corrupt)
    seen = observe_copies()

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from vllm_ascend_ext.models import tiny_qwen3_next_path

    kwargs = {}
    if args.spec:
        kwargs["speculative_config"] = {"method": "ngram", "num_speculative_tokens": 3,
                                        "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    path = tiny_qwen3_next_path()
    if args.variant:
        import tempfile

        from vllm_ascend_ext.models.make_tiny_qwen3_next import save_variant

        path = str(save_variant(tempfile.mkdtemp(prefix="tiny-qwen3-next-"),
                                json.loads(args.variant)))
    llm = LLM(model=path, dtype=args.dtype, seed=0, max_model_len=2048,
              max_num_batched_tokens=args.budget, max_num_seqs=8, enforce_eager=True,
              enable_prefix_caching=args.caching == "on",
              additional_config={"ascend_ext": {"mixed_split": args.mixed_split}}, **kwargs)
    cache = llm.llm_engine.vllm_config.cache_config
    sp = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, logprobs=1, ignore_eos=True)
    result = {"prefix_caching": cache.enable_prefix_caching,
              "mamba_cache_mode": cache.mamba_cache_mode, "block_size": cache.block_size,
              "waves": []}
    text, block = text_maker(), cache.block_size

    def serve(prompts):
        outs = llm.generate([TokensPrompt(prompt_token_ids=t) for t in prompts], sp,
                            use_tqdm=False)
        result["waves"].append({
            "prompt_lens": [len(t) for t in prompts],
            "cached": [o.num_cached_tokens or 0 for o in outs],
            "tokens": [list(o.outputs[0].token_ids) for o in outs],
            "logprobs": [[lp[t].logprob for t, lp in zip(o.outputs[0].token_ids,
                                                         o.outputs[0].logprobs)]
                         for o in outs]})
        return outs
    a, b = first_wave(block, text)
    one = serve([a + text(block - 22), b])
    # wave 2 continues B with the answer it was given (the run's own: a control that
    # changes it is compared on the whole second wave anyway)
    serve(second_wave(block, text, a, b, list(one[1].outputs[0].token_ids)))
    from engine_info import engine_info
    from vllm.triton_utils.dispatcher import _registry

    impl = _registry.get("vllm.v1.worker.mamba_utils.batch_memcpy_kernel", (None, None))[1]
    seen["batch_memcpy"] //= 2          # two addresses located per copy
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    bufs = getattr(runner, "_mamba_bufs", None)
    result["split"] = [[b.stats.mixed, b.stats.split] for g in runner._attn_group_iterator()
                       for b in g.metadata_builders if hasattr(b, "stats")]
    result["copies"] = {**seen, "substitute": f"{impl.__module__}.{impl.__name__}",
                        "spec_context": type(getattr(bufs, "postprocess_align", None)).__name__}
    result["engine"] = engine_info(llm)
    from vllm_ascend_ext.contract import mode

    if mode.enabled():
        h = mode.harness()
        result["contract"] = {"violations": h.violations, "summary": h.summary()}
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
