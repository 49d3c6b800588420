"""Run the embedded tiny DeepSeek-V3.2-style model offline; print one RESULT JSON line.

    python tests/e2e/run_dsa.py [--quantized] [--preprocess auto|native|prolog_v3]
        [--kv-role kv_consumer] [--max-num-batched-tokens N] [--count-ops]
        [--corrupt-block-table] [--dense-topk] [--layers N]

ASCEND_EXT_EMULATE=1 must be set (the SFA backend exists only under the plugin).
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from spec_harness import count_substitutes, oracle_drafts, spec_result  # noqa: E402

WORDS = ("the quick brown fox jumps over the lazy dog attention is computed over keys and "
         "values stored in a paged cache a decode step reads every cached token of its request "
         "while a prefill chunk attends causally to the prefix numbers like 1 2 3 4 5").split()


def prompts(n: int, min_words: int, seed: int = 0) -> list[str]:
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(min_words, min_words + 40)))
            for _ in range(n)]


def corrupt_block_table() -> None:
    """Negative control: every request reads the next request's cache blocks."""
    import dataclasses

    from vllm_ascend_ext.attention.sfa import builder

    original = builder.AscendSFAMetadataBuilder.build

    def build(self, *a, **k):
        md = original(self, *a, **k)
        return dataclasses.replace(md, block_table=md.block_table.roll(1, dims=0))

    builder.AscendSFAMetadataBuilder.build = build


def corrupt_moe_bias() -> None:
    """Negative control: MoE routing selects experts without the correction bias."""
    from vllm_ascend_ext.moe import experts

    original = experts.route
    experts.route = lambda plan, logits, bias: original(plan, logits, bias * 0)


def moe_weights_vs_checkpoint(model, model_dir: str) -> float:
    """Largest difference between each MoE layer's loaded experts, as the kernels take them
    ([E, K, N], scales [E, N]), and the checkpoint's per-expert tensors read here, apart
    from vLLM's loader: w13 = [gate; up], w2 = down, int8 times per-channel scale."""
    import torch
    from safetensors.torch import load_file

    ckpt = load_file(f"{model_dir}/model.safetensors")
    worst = 0.0
    for name, m in model.named_modules():
        if not hasattr(m, "w13_weight") or not name.endswith(".experts.routed_experts"):
            continue
        prefix = name[: -len(".routed_experts")]
        quantized = m.w13_weight.dtype == torch.int8

        def expert(e: int, proj: str, prefix: str = prefix, quantized: bool = quantized):
            w = ckpt[f"{prefix}.{e}.{proj}.weight"].double()
            return w * ckpt[f"{prefix}.{e}.{proj}.weight_scale"].double() if quantized else w

        for e in range(m.w13_weight.shape[0]):
            w13 = m.w13_weight[e].double().t()
            w2 = m.w2_weight[e].double().t()
            if quantized:
                w13 = w13 * m.w13_weight_scale[e].double()[:, None]
                w2 = w2 * m.w2_weight_scale[e].double()[:, None]
            want13 = torch.cat([expert(e, "gate_proj"), expert(e, "up_proj")])
            worst = max(worst, (w13 - want13).abs().max().item(),
                        (w2 - expert(e, "down_proj")).abs().max().item())
    return worst


def int8_weight_formats(model) -> dict[str, int]:
    """How many int8 parameters (W8A8 linears, experts) the engine holds in each format
    (disposed native-chain weights, emptied, are not held)."""
    import torch

    from vllm_ascend_ext.ops.format import format_name, npu_format

    out: dict[str, int] = {}
    for p in model.parameters():
        if p.dtype == torch.int8 and p.numel():
            out[format_name(npu_format(p))] = out.get(format_name(npu_format(p)), 0) + 1
    return out


def prolog_nd_copies(layers) -> int:
    """Prolog source weights still resident beside (not shared with) the prolog's NZ copy."""
    from vllm_ascend_ext.attention.sfa.weights import PROLOG_SOURCES

    count = 0
    for layer in layers:
        prolog = layer.weights.prolog
        if prolog is None:
            continue
        for name, w in zip(PROLOG_SOURCES, (prolog.w_dq, prolog.w_uq_qr, prolog.w_dkv_kr)):
            own = getattr(layer.projections, name).weight
            count += int(own.numel() > 0 and own.data_ptr() != w.data_ptr())
    return count


SELECTION: dict[str, int] = {"max_selected": 0, "max_visible": 0, "calls": 0,
                             "first_step_tokens": 0}


def probe_indexer() -> None:
    """Record how many keys the indexer keeps vs how many are visible (test only)."""
    from vllm_ascend_ext.attention.sfa import indexer

    original = indexer.topk_stage

    def topk_stage(*a, **k):
        idx = original(*a, **k)
        meta = a[5]
        if SELECTION["calls"] == 0:
            SELECTION["first_step_tokens"] = meta.num_actual_tokens
        SELECTION["calls"] += 1
        SELECTION["max_selected"] = max(SELECTION["max_selected"], int((idx >= 0).sum(-1).max()))
        SELECTION["max_visible"] = max(SELECTION["max_visible"], int(meta.seq_lens.max()))
        return idx

    indexer.topk_stage = topk_stage


def corrupt_verify_slot() -> None:
    """Negative control: the SFA builder gives verify rows (2..4 query tokens) one more KV
    position than they have (test-only patch)."""
    from vllm_ascend_ext.attention.sfa import builder

    original = builder.AscendSFAMetadataBuilder.build

    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        cam = common_attn_metadata
        md = original(self, common_prefix_len, cam, fast_build)
        qsl = cam.query_start_loc_cpu[: md.num_reqs + 1]
        q = (qsl[1:] - qsl[:-1]).to(md.seq_lens.device)
        import dataclasses

        return dataclasses.replace(md, seq_lens=torch.where((q > 1) & (q <= 4),
                                                            md.seq_lens + 1, md.seq_lens))
    builder.AscendSFAMetadataBuilder.build = build


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quantized", action="store_true")
    ap.add_argument("--preprocess", default=None)
    ap.add_argument("--kv-role", default=None)
    ap.add_argument("--kv-path", default=None, help="ExampleConnector storage (shared by runs)")
    ap.add_argument("--max-num-batched-tokens", type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--min-words", type=int, default=110)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--count-ops", action="store_true")
    ap.add_argument("--corrupt-block-table", action="store_true")
    ap.add_argument("--corrupt-moe-bias", action="store_true")
    ap.add_argument("--dense-topk", action="store_true", help="index_topk = 4096 (no sparsity)")
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--dummy", action="store_true", help="load_format=dummy")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--layer-ops", default=None, help="ascend_ext.layer_ops value")
    ap.add_argument("--no-probe", action="store_true",
                    help="no indexer-selection probe (its host reads would count as syncs)")
    ap.add_argument("--mtp", type=int, default=0, help="MTP speculation with this many drafts")
    ap.add_argument("--oracle", nargs=2, metavar=("PLAIN_RESULT", "RATE"),
                    help="replace RATE of the drafts by PLAIN_RESULT's tokens (spec_harness)")
    ap.add_argument("--ragged", action="store_true", help="max_tokens differs per prompt")
    ap.add_argument("--corrupt-verify-slot", action="store_true",
                    help="verify rows (2..4 query tokens) read one KV slot past their sequence")
    args = ap.parse_args()
    if args.corrupt_block_table:
        corrupt_block_table()
    if args.corrupt_moe_bias:
        corrupt_moe_bias()
    if not args.no_probe:
        probe_indexer()
    if args.corrupt_verify_slot:
        corrupt_verify_slot()
    substitute_calls = count_substitutes()

    from vllm import LLM, SamplingParams

    from vllm_ascend_ext.models import tiny_dsa_path

    kwargs: dict = {}
    cfg: dict = {}
    if args.preprocess:
        cfg["sfa"] = {"preprocess": args.preprocess}
    if args.layer_ops:
        cfg["layer_ops"] = args.layer_ops
    if cfg:
        kwargs["additional_config"] = {"ascend_ext": cfg}
    if args.kv_role:
        import tempfile

        kwargs["kv_transfer_config"] = {
            "kv_connector": "ExampleConnector", "kv_role": args.kv_role,
            "kv_connector_extra_config": {"shared_storage_path": args.kv_path or tempfile.mkdtemp()}}
    if args.max_num_batched_tokens:
        kwargs.update(max_num_batched_tokens=args.max_num_batched_tokens,
                      enable_chunked_prefill=True)
    overrides = {}
    if args.layers:
        overrides["num_hidden_layers"] = args.layers
    if args.dense_topk:
        overrides["index_topk"] = 4096
    if overrides:
        kwargs["hf_overrides"] = overrides
    if args.dummy:
        kwargs["load_format"] = "dummy"
    if args.mtp:
        kwargs["speculative_config"] = {"method": "mtp", "num_speculative_tokens": args.mtp}
    llm = LLM(model=tiny_dsa_path(args.quantized), dtype=args.dtype, seed=0, max_model_len=1024,
              enforce_eager=args.enforce_eager, disable_log_stats=False, **kwargs)
    ps = prompts(args.num_prompts, args.min_words)
    sp = [SamplingParams(max_tokens=args.max_tokens - (3 * (i % 3) if args.ragged else 0),
                         temperature=0.0, logprobs=1, ignore_eos=True) for i in range(len(ps))]
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    oracle = oracle_drafts(runner, args.oracle[0], float(args.oracle[1])) if args.oracle else None
    model = runner.model
    layers = model.sfa_layers()
    counter = None
    if args.count_ops:
        from vllm_ascend_ext.attention.sfa.builder import AscendSFAMetadataBuilder
        from vllm_ascend_ext.ops.counting import OpCounter

        counter = OpCounter(steps_of=AscendSFAMetadataBuilder)
        for layer in layers:
            counter.watch(layer.projections.indexer.wk_weights_proj.weight, "wk_weights_proj")
        counter.__enter__()
    outs = llm.generate(ps, sp, use_tqdm=False)
    if counter is not None:
        counter.__exit__(None, None, None)
    result = {
        "model_class": type(model).__name__,
        "moe_methods": sorted({type(m.quant_method).__name__ for m in model.modules()
                               if "MoE" in type(getattr(m, "quant_method", None)).__name__}),
        "quant": llm.llm_engine.vllm_config.model_config.quantization,
        "moe_weights_vs_checkpoint": (None if args.dummy else moe_weights_vs_checkpoint(
            model, tiny_dsa_path(args.quantized))),
        "backends": sorted({layer.attn_backend.get_name() for layer in layers}),
        "routes": [[layer.route.preprocess, layer.route.reason] for layer in layers],
        "fallback_bytes_freed": sum(layer.weights.fallback_bytes_freed for layer in layers),
        "int8_weight_formats": int8_weight_formats(model),
        "prolog_nd_copies": prolog_nd_copies(layers),
        "block_size": llm.llm_engine.vllm_config.cache_config.block_size,
        "kv_cache_groups": [sorted(g.layer_names) for g in runner.kv_cache_config.kv_cache_groups],
        "caches": [[list(c.shape), c.is_contiguous(), c.data_ptr()] for layer in layers
                   for c in layer.caches()],
        "selection": SELECTION,
        "chunked_prefill": llm.llm_engine.vllm_config.scheduler_config.enable_chunked_prefill,
        "prompt_token_ids": [list(o.prompt_token_ids) for o in outs],
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "logprobs": [[lp[t].logprob for t, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)]
                     for o in outs],
    }
    from engine_info import engine_info

    result["engine"] = engine_info(llm)
    result.update(spec_result(llm, runner, substitute_calls, oracle))
    if getattr(runner, "drafter", None) is not None:
        drafter = runner.drafter.model
        result["drafter"] = {"class": type(drafter).__name__,
                             "sfa_layers": [la.layer_name for la in drafter.sfa_layers()]
                             if hasattr(drafter, "sfa_layers") else []}
    if counter is not None:
        result["steps"] = [{"kind": s.kind, "ops": dict(s.ops), "views": s.views,
                            "in_layers": dict(s.in_layers)}
                           for s in counter.steps]
    from vllm_ascend_ext.contract import mode

    if mode.enabled():  # this process ran every NPU call (uni executor)
        h = mode.harness()
        result["contract"] = {"calls": dict(h.calls), "violations": h.violations,
                              "summary": h.summary()}
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
