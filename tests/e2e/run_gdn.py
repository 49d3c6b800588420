"""The embedded tiny Qwen3-Next (3 Gated-DeltaNet + 1 full-attention layer, realistic
weights) served in emulation; prints one ``RESULT {json}`` line.

    python tests/e2e/run_gdn.py [--spec] [--budget N] [--dtype float32] [--hf]
                                [--corrupt accepted-offset|state-index] [--count-ops]

``--spec``: ngram speculation with 3 drafts. ``--mtp K``: MTP speculation with K drafts
(the checkpoint's own MTP layer; ``--oracle FILE RATE``: a deterministic RATE of the
drafts replaced by FILE's plain greedy continuation, so that drafts are accepted as well as
rejected; the untrained MTP layer alone agrees with the model ~3% of the time).
``--ragged``: each prompt its own ``max_tokens`` (requests finish mid-draft). ``--hf``: also greedy-decode the same
prompts with Hugging Face transformers' Qwen3-Next (fp32, its own PyTorch GDN code) on the
same weights, as the independent reference. ``--corrupt``: negative controls inside the
plugin's GDN path (test-only patches): ``accepted-offset`` makes every verify row resume
from slot column 0, ignoring the accepted count; ``state-index`` points every decode
token's state slot at its neighbour's; ``drafted-count`` advances every verify row's
state by its drafted instead of its accepted count; ``verify-slot`` makes the target's
full-attention verify rows read one KV slot past their sequence.
"""

from __future__ import annotations

import argparse
import json
import os

import torch

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from spec_harness import (  # noqa: E402
    corrupt_fia_verify_slot,
    count_substitutes,
    oracle_drafts,
    spec_result,
)

SYNC_OPS = ("aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.item")
PROMPTS = ["the quick brown fox jumps over the lazy dog and the quick brown fox",
           "one two three four five six seven eight one two three four",
           "a b c d e f g a b c d e f g a b",
           "numbers like 1 2 3 and 4 5 6 then 1 2 3",
           "hello world hello world hello",
           "red green blue red green blue red green",
           "to be or not to be that is the question to be",
           "alpha beta gamma delta alpha beta gamma"]


def corrupt(kind: str) -> None:
    from vllm_ascend_ext.attention.gdn import builder, core

    if kind == "accepted-offset":
        core.apply_accepted_guard = lambda *a, **k: None
        original = builder.AscendGdnMetadataBuilder.build_from_spans

        def build(self, *args, **kwargs):
            md = original(self, *args, **kwargs)
            md.accepted_in_op = False
            return md
        builder.AscendGdnMetadataBuilder.build_from_spans = build
    elif kind == "state-index":
        original = builder.AscendGdnMetadataBuilder.build_from_spans

        def build(self, *args, **kwargs):
            md = original(self, *args, **kwargs)
            if md.recurrent is not None and md.recurrent.num_reqs > 1:
                md.recurrent.token_slots = md.recurrent.token_slots.roll(1)
            return md
        builder.AscendGdnMetadataBuilder.build_from_spans = build
    elif kind == "drafted-count":
        original_build = builder.AscendGdnMetadataBuilder.build

        def build(self, common_prefix_len, cam, num_accepted_tokens=None, *a, **k):
            if num_accepted_tokens is not None:
                num_accepted_tokens = torch.full_like(num_accepted_tokens, self.num_spec + 1)
            return original_build(self, common_prefix_len, cam, num_accepted_tokens, *a, **k)
        builder.AscendGdnMetadataBuilder.build = build
    elif kind == "verify-slot":
        corrupt_fia_verify_slot()
    else:
        raise SystemExit(f"unknown --corrupt {kind}")






def observe_steps() -> dict:
    """Step kinds the GDN builder produced (observation only: wraps, changes nothing)."""
    from vllm_ascend_ext.attention.gdn import builder

    seen = {"kinds": {}, "guard_steps": 0, "accepted_in_op_steps": 0, "reordered_steps": 0,
            "max_prefill_len": 0, "continued_prefill_rows": 0}
    original = builder.AscendGdnMetadataBuilder.build_from_spans

    def build(self, spans, *args, **kwargs):
        md = original(self, spans, *args, **kwargs)
        seen["kinds"][md.kind] = seen["kinds"].get(md.kind, 0) + 1
        if md.speculative and md.recurrent is not None:
            seen["accepted_in_op_steps" if md.accepted_in_op else "guard_steps"] += 1
        seen["reordered_steps"] += md.token_order is not None
        seen["max_prefill_len"] = max([seen["max_prefill_len"], *spans.pre_lens])
        seen["continued_prefill_rows"] += sum(spans.pre_has_state)
        return md
    builder.AscendGdnMetadataBuilder.build_from_spans = build
    return seen




def hf_greedy(path: str, prompt_ids: list[list[int]], max_tokens: int):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokens, logprobs = [], []
    with torch.no_grad():
        for ids in prompt_ids:
            seq, lps = list(ids), []
            for _ in range(max_tokens):
                logits = model(torch.tensor([seq])).logits[0, -1].double()
                lp = torch.log_softmax(logits, -1)
                t = int(lp.argmax())
                seq.append(t)
                lps.append(float(lp[t]))
            tokens.append(seq[len(ids):])
            logprobs.append(lps)
    return tokens, logprobs


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--spec", action="store_true")
    p.add_argument("--mtp", type=int, default=0, help="MTP speculation with this many drafts")
    p.add_argument("--budget", type=int, default=256)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--oracle", nargs=2, metavar=("PLAIN_RESULT", "RATE"))
    p.add_argument("--ragged", action="store_true")
    p.add_argument("--hf", action="store_true")
    p.add_argument("--corrupt")
    p.add_argument("--count-ops", action="store_true")
    p.add_argument("--eager", action="store_true")
    p.add_argument("--mixed-split", default="auto")
    p.add_argument("--layer-ops", default="fused", help="ascend_ext.layer_ops value")
    args = p.parse_args()
    if args.corrupt:
        corrupt(args.corrupt)
    seen = observe_steps()
    substitute_calls = count_substitutes()

    from vllm import LLM, SamplingParams

    from vllm_ascend_ext.models import tiny_qwen3_next_path

    kwargs = {}
    if args.spec:
        kwargs["speculative_config"] = {"method": "ngram", "num_speculative_tokens": 3,
                                        "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    if args.mtp:
        kwargs["speculative_config"] = {"method": "mtp", "num_speculative_tokens": args.mtp}
    path = tiny_qwen3_next_path()
    llm = LLM(model=path, disable_log_stats=False, dtype=args.dtype, seed=0, max_model_len=512,
              max_num_batched_tokens=args.budget, max_num_seqs=16, enforce_eager=args.eager,
              additional_config={"ascend_ext": {"mixed_split": args.mixed_split,
                                                 "layer_ops": args.layer_ops}}, **kwargs)
    n_prompts = len(PROMPTS[:args.num_prompts])
    sp = [SamplingParams(max_tokens=args.max_tokens - (3 * (i % 3) if args.ragged else 0),
                         temperature=0.0, logprobs=1, ignore_eos=True) for i in range(n_prompts)]
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    oracle = oracle_drafts(runner, args.oracle[0], float(args.oracle[1])) if args.oracle else None
    model = runner.model
    counter = None
    if args.count_ops:
        from vllm_ascend_ext.attention.gdn.builder import AscendGdnMetadataBuilder
        from vllm_ascend_ext.ops.counting import OpCounter

        counter = OpCounter(steps_of=AscendGdnMetadataBuilder)
        counter.__enter__()
    outs = llm.generate(PROMPTS[:args.num_prompts], sp, use_tqdm=False)
    if counter is not None:
        counter.__exit__(None, None, None)
    gdn = [m for m in model.modules() if type(m).__name__ == "AscendGatedDeltaNet"]
    vconf = llm.llm_engine.vllm_config
    result = {
        "gdn_layer_classes": sorted({type(m).__name__ for m in model.modules()
                                     if "GatedDeltaNet" in type(m).__name__}),
        "gdn_layers": len(gdn),
        "gdn_ops": [vars(gdn[0].gdn_ops)] if gdn else [],
        "builders": sorted({type(b).__name__ for g in runner._attn_group_iterator()
                            for b in g.metadata_builders}),
        "split": [[getattr(getattr(b, "stats", None), "mixed", None),
                   getattr(getattr(b, "stats", None), "split", None)]
                  for g in runner._attn_group_iterator() for b in g.metadata_builders
                  if hasattr(b, "stats")],
        "gdn_steps": seen,
        "prefix_caching": vconf.cache_config.enable_prefix_caching,
        "mamba_cache_mode": vconf.cache_config.mamba_cache_mode,
        "prompt_token_ids": [list(o.prompt_token_ids) for o in outs],
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "logprobs": [[lp[t].logprob for t, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)]
                     for o in outs],
    }
    from engine_info import engine_info

    result["engine"] = engine_info(llm)
    result.update(spec_result(llm, runner, substitute_calls, oracle))
    if counter is not None:
        result["steps"] = [{"kind": s.kind, "in_layers": dict(s.in_layers),
                            "syncs_in_layers": sum(s.in_layers.get(n, 0) for n in SYNC_OPS)}
                           for s in counter.steps[1:]]
    if args.hf:
        result["hf_tokens"], result["hf_logprobs"] = hf_greedy(path, result["prompt_token_ids"],
                                                                args.max_tokens)
    from vllm_ascend_ext.contract import mode

    if mode.enabled():  # this process ran every NPU call (uni executor)
        h = mode.harness()
        result["contract"] = {"calls": dict(h.calls), "violations": h.violations,
                              "summary": h.summary()}
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
