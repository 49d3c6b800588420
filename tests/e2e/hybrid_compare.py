"""Hybrid models (Qwen3-Next / Qwen3.5 architecture) served emulated vs Hugging Face
transformers on the same checkpoint: token by token, and layer by layer.

    ASCEND_EXT_EMULATE=1 python tests/e2e/hybrid_compare.py [--model DIR | --variant JSON]
        [--dtype float32|bfloat16] [--prompts 8] [--min-len 30] [--max-len 300]
        [--max-tokens 16] [--budget 64] [--eager] [--spec] [--layers I] [--json]

Token mode (always): the plugin's engine greedy-decodes the prompts (random token ids,
lengths spread over ``--min-len..--max-len``, deterministic); transformers then runs each
prompt followed by the plugin's tokens once, in float64 (``experts_implementation=
"eager"``) and in the run's dtype, which gives the reference's greedy choice and logprob
at every generated position given the same prefix (teacher forcing: the same choices as
free-running greedy decoding up to the first difference, and comparable logprobs after
it). Per prompt: the first generated position whose token differs from each reference,
the largest logprob gap, the reference's top-2 margin there, and the MoE routing ties.

A *routing tie* is a (layer, position) whose float64 router probabilities of the k-th
and (k+1)-th expert differ by less than ``--tie-eps``: there fp32 rounding alone may pick
either expert, so a difference after one is reported as such, not counted as a failure.

Layer mode (``--layers I``): prompt ``I`` runs alone in an eager engine with forward
hooks on every decoder layer's token mixer (GDN or attention), MoE block and output
stream, over its prefill and every decode step; transformers runs the same token
sequence with the same hooks in float64 and in the run's dtype. The first (position,
layer, part) whose relative error against float64 exceeds ``--noise-factor`` times the
run-dtype reference's own error there (and ``--floor``) is named: the first departure.

``--variant '{"hidden_size": 256, ...}'`` generates a Qwen3-Next checkpoint of that
configuration (the embedded model's generator, other widths) in a temporary directory.
Prints one ``RESULT {json}`` line (``--json``) or a readable report.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

os.environ.setdefault("ASCEND_EXT_EMULATE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import sys  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hybrid_judge import (  # noqa: E402
    BF16_TIE_EPS,
    FP32_TIE_EPS,
    PARTS,
    bf16_counted,
    bf16_failures,
    compare_tokens,
    excused_fraction,
    first_departure,
    fp32_failures,
    quantile,
    routing_gaps,
    routing_report,
    tie_positions,
)


def prompt_ids(n: int, lo: int, hi: int, vocab: int, seed: int = 1, kind: str = "random",
               model: str | None = None, lengths: list[int] | None = None) -> list[list[int]]:
    """``n`` prompts, lengths spread over lo..hi: random token ids (no special tokens),
    ``text`` (the tokenizer's words in random order) or ``repeat`` (one short sentence
    repeated: many equal tokens, as in repetitive text)."""
    import random

    g = torch.Generator().manual_seed(seed)
    lens = (list(lengths) if lengths else [lo + (hi - lo) * i // max(n - 1, 1) for i in range(n)])
    n = len(lens)
    order = torch.randperm(n, generator=g).tolist() if not lengths else list(range(n))
    if kind == "random":
        return [torch.randint(2, vocab, (lens[i],), generator=g).tolist() for i in order]
    from transformers import AutoTokenizer

    from vllm_ascend_ext.models.make_tiny_qwen3 import _CORPUS_SEED

    tok = AutoTokenizer.from_pretrained(model)
    rng = random.Random(seed)
    words = _CORPUS_SEED.replace(".", " .").split()
    out = []
    for i in order:
        if kind == "repeat":
            sentence = " ".join(rng.choice(words) for _ in range(rng.randint(4, 12)))
            text = " ".join([sentence] * lens[i])
        else:
            text = " ".join(rng.choice(words) for _ in range(lens[i]))
        out.append(tok(text).input_ids[: lens[i]])
    return out


# ----------------------------------------------------------------------------- plugin side
def plugin_engine(model: str, args):
    from vllm import LLM

    kwargs = {}
    if args.spec:
        kwargs["speculative_config"] = {"method": "ngram", "num_speculative_tokens": 3,
                                        "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    if args.kv_blocks:  # a cache too small for every prompt at once: requests get preempted
        kwargs["num_gpu_blocks_override"] = args.kv_blocks
    if args.block_size:
        kwargs["block_size"] = args.block_size
    if args.layers is not None:
        # the layer capture records every position's computation; the teacher-forced pass
        # would otherwise resume from the prefix-cache checkpoints of the generation pass
        kwargs["enable_prefix_caching"] = False
    return LLM(model=model, dtype=args.dtype, seed=0, max_model_len=args.max_model_len,
               max_num_batched_tokens=args.budget, enforce_eager=args.eager or args.layers
               is not None, additional_config={"ascend_ext": {}}, **kwargs)


def model_runner(llm):
    return llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner


def attention_kernel_block(llm) -> int | None:
    """The block size of the full-attention layers' KV cache (the FIA kernel's block)."""
    runner = model_runner(llm)
    for name, layer in runner.compilation_config.static_forward_context.items():
        if name.endswith("self_attn.attn") and isinstance(getattr(layer, "kv_cache", None),
                                                          torch.Tensor):
            return int(layer.kv_cache.shape[2])      # [blocks, K/V, block, heads x dim]
    return None


def plugin_generate(llm, prompts, max_tokens: int):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=1, ignore_eos=True)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp,
                        use_tqdm=False)
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    lps = [[lp[t].logprob for t, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)]
           for o in outs]
    return tokens, lps


def _runner_model(llm):
    return llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker \
        .model_runner.model


def _mixer(layer):
    return getattr(layer, "linear_attn", None) or layer.self_attn


def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


def plugin_layers(llm, prompt: list[int], max_tokens: int) -> dict[str, torch.Tensor]:
    """Per-position outputs of every layer part over prefill and decode, float64,
    ``{"L{i}.{part}": [positions, hidden]}``, plus the positions' tokens' count."""
    model = _runner_model(llm)
    layers = model.model.layers
    rows: dict[str, list[torch.Tensor]] = {f"L{i}.{p}": [] for i in range(len(layers))
                                           for p in PARTS}
    positions: list[torch.Tensor] = []
    handles = []

    def take(name):
        def hook(_m, _inp, out):
            if name.endswith("stream"):
                hidden, residual = out[0], out[1]
                val = hidden if residual is None else hidden + residual
            else:
                val = _first(out)
            rows[name].append(val.detach().to(torch.float64).clone())
        return hook

    def pos_hook(_m, args, kwargs):  # a decoder layer's (hidden_states, residual, positions)
        pos = kwargs["positions"] if "positions" in kwargs else args[2]
        positions.append(pos.detach().clone())

    handles.append(layers[0].register_forward_pre_hook(pos_hook, with_kwargs=True))
    for i, layer in enumerate(layers):
        handles.append(_mixer(layer).register_forward_hook(take(f"L{i}.mixer")))
        handles.append(layer.mlp.register_forward_hook(take(f"L{i}.mlp")))
        handles.append(layer.register_forward_hook(take(f"L{i}.stream")))
        if hasattr(layer.mlp, "gate"):
            rows[f"L{i}.router"] = []
            handles.append(layer.mlp.gate.register_forward_hook(take(f"L{i}.router")))
    try:
        tokens, _ = plugin_generate(llm, [prompt], max_tokens)
    finally:
        for h in handles:
            h.remove()
    # rows past the step's tokens (padding) carry no position of this request
    n_pos = max(len(prompt) + max_tokens - 1, 1 + max(int(p.max()) for p in positions))
    out = {}
    for name, chunks in rows.items():
        full = torch.full((n_pos, chunks[0].shape[-1]), float("nan"), dtype=torch.float64)
        for pos, val in zip(positions, chunks):
            n = min(pos.shape[0], val.shape[0])
            full[pos[:n].long()] = val[:n]
        out[name] = full
    out["_tokens"] = torch.tensor(tokens[0])
    want = len(prompt) + max_tokens - 1           # the positions the request computed
    out["_missing"] = sum(int(v[:want].isnan().any(-1).sum()) for v in out.values()
                          if v.is_floating_point())
    return out


# ------------------------------------------------------------------------ reference side
def hf_model(path: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    kw = {"experts_implementation": "eager"} if dtype == torch.float64 else {}
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kw).eval()


def hf_teacher_forced(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """Logprobs over the generated positions given prompt + tokens[:-1], float64 [G, V]."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens[:-1]])).logits[0, len(prompt) - 1:]
    return torch.log_softmax(logits.double(), -1)


def dense_teacher_forced(dense, prompt: list[int], tokens: list[int], top_k: int):
    """Logprobs over the generated positions given prompt + tokens[:-1] from the
    independent float64 model (``dense_qwen3_next``), its routing gaps and layer parts."""
    out = dense.forward(prompt + tokens[:-1])
    lp = torch.log_softmax(out["logits"][len(prompt) - 1:], -1)
    return lp, routing_gaps(out["routers"], top_k), out["parts"]


def hf_layers(model, seq: list[int]) -> dict[str, torch.Tensor]:
    rows: dict[str, torch.Tensor] = {}
    handles = []

    def take(name):
        def hook(_m, _inp, out):
            rows[name] = _first(out)[0].detach().to(torch.float64)
        return hook

    for i, layer in enumerate(model.model.layers):
        handles.append(_mixer(layer).register_forward_hook(take(f"L{i}.mixer")))
        handles.append(layer.mlp.register_forward_hook(take(f"L{i}.mlp")))
        handles.append(layer.register_forward_hook(take(f"L{i}.stream")))
    try:
        with torch.no_grad():
            model(torch.tensor([seq]))
    finally:
        for h in handles:
            h.remove()
    return rows


# ------------------------------------------------------------------------------ compare
def variant_model(overrides: dict, out_dir: str, seed: int = 0) -> str:
    from vllm_ascend_ext.models.make_tiny_qwen3_next import save_variant

    return str(save_variant(out_dir, overrides, seed))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model")
    p.add_argument("--variant", help="JSON overrides of the embedded model's config")
    p.add_argument("--seed", type=int, default=0, help="weights' seed with --variant")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--min-len", type=int, default=30)
    p.add_argument("--max-len", type=int, default=300)
    p.add_argument("--prompt-seed", type=int, default=1)
    p.add_argument("--lengths", type=lambda v: [int(x) for x in v.split(",")],
                   help="comma-separated prompt lengths (instead of --prompts/--min-len/--max-len)")
    p.add_argument("--prompt-kind", default="random", choices=("random", "text", "repeat"))
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--budget", type=int, default=64, help="max_num_batched_tokens")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--eager", action="store_true")
    p.add_argument("--kv-blocks", type=int, help="num_gpu_blocks_override (forces preemption)")
    p.add_argument("--spec", action="store_true", help="ngram speculation, 3 drafts")
    p.add_argument("--block-size", type=int, help="scheduler block size (FIA serves one above "
                   "512 through smaller kernel blocks)")
    p.add_argument("--layers", type=int, help="layer mode for this prompt index")
    p.add_argument("--tie-eps", type=float, help="router-logit gap of a routing tie "
                   f"(default {FP32_TIE_EPS:g} in float32, {BF16_TIE_EPS:g} in bfloat16)")
    p.add_argument("--noise-factor", type=float, default=20.0)
    p.add_argument("--floor", type=float, default=1e-5)
    p.add_argument("--no-hf", action="store_true", help="token mode against the float64 "
                   "dense model only (faster)")
    p.add_argument("--corrupt", choices=("conv-taps", "attn-scale", "slot-mapping"),
                   help="negative control: break the plugin's path on purpose")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()

    tmp = tempfile.TemporaryDirectory()
    if args.variant:
        path = variant_model(json.loads(args.variant), os.path.join(tmp.name, "model"),
                             args.seed)
    else:
        from vllm_ascend_ext.models import tiny_qwen3_next_path

        path = args.model or tiny_qwen3_next_path()
    result = compare(path, args)
    if args.json:
        print("RESULT " + json.dumps(result))
    else:
        report(result)


def compare(path: str, args) -> dict:
    from dense_qwen3_next import DenseQwen3Next
    from engine_info import engine_info

    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    prompts = prompt_ids(args.prompts, args.min_len, args.max_len, config["vocab_size"],
                         args.prompt_seed, args.prompt_kind, path, args.lengths)
    if args.corrupt:
        corrupt(args.corrupt)
    llm = plugin_engine(path, args)
    tokens, lps = plugin_generate(llm, prompts, args.max_tokens)
    attn_block = attention_kernel_block(llm)
    run_dtype = getattr(torch, args.dtype)
    top_k = config.get("num_experts_per_tok", 0)
    tie_eps = args.tie_eps or (FP32_TIE_EPS if args.dtype == "float32" else BF16_TIE_EPS)
    dense = DenseQwen3Next(path)
    hf = {} if args.no_hf and args.layers is None else {
        "hf_float64": hf_model(path, torch.float64), f"hf_{args.dtype}": hf_model(path, run_dtype)}
    result = {"model": path, "dtype": args.dtype, "tie_eps": tie_eps,
              "routed": config.get("num_experts", 0) > top_k,
              "attention_kernel_block": attn_block,
              "runner": type(model_runner(llm)).__name__,
              "engine": engine_info(llm),
              "config": {k: config[k] for k in CONFIG_SHOWN if k in config}, "prompts": []}
    for prompt, toks, lp in zip(prompts, tokens, lps):
        entry = {"len": len(prompt), "tokens": toks, "logprobs": lp}
        exact_lp, gaps, _ = dense_teacher_forced(dense, prompt, toks, top_k)
        entry["dense_float64"] = compare_tokens(toks, lp, exact_lp, exact_lp)
        entry["routing_ties"] = {"positions": tie_positions(gaps, tie_eps),
                                 "min_gap": float(gaps.min()) if gaps.numel() else None}
        for name, model in hf.items():
            entry[name] = compare_tokens(toks, lp, hf_teacher_forced(model, prompt, toks),
                                         exact_lp)
        result["prompts"].append(entry)
    result["excused_fraction"] = excused_fraction(result)
    # bf16 is judged against transformers bf16's own rounding: without it, no verdict
    result["failures"] = (fp32_failures(result) if args.dtype == "float32"
                          else bf16_failures(result) if hf else None)
    if args.dtype != "float32" and hf:
        result["bf16_counted"] = bf16_counted(result)
    if args.layers is not None:
        prompt = prompts[args.layers]
        got = plugin_layers(llm, prompt, args.max_tokens)
        seq = prompt + got.pop("_tokens").tolist()[:-1]
        missing = got.pop("_missing")
        exact = dense.forward(seq)
        ref_run = hf_layers(hf[f"hf_{args.dtype}"], seq)
        result["layers"] = {"prompt": args.layers, "len": len(prompt),
                            "missing_rows": missing, **first_departure(
            got, exact["parts"], ref_run, config["num_hidden_layers"], args.noise_factor,
            args.floor), "routing": routing_report(got, exact["routers"], top_k, tie_eps)}
    return result


CONFIG_SHOWN = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "linear_num_key_heads", "linear_num_value_heads", "num_experts",
                "num_experts_per_tok", "tie_word_embeddings")


def report(result: dict) -> None:
    print(f"model {result['model']} ({result['dtype']}): {result['config']}")
    refs = [k for k in result["prompts"][0] if k.startswith(("dense_", "hf_"))]
    print("prompt len | " + " | ".join(f"{r}: first diff, max |dlogprob|" for r in refs)
          + f" | routing ties (positions with a router-logit gap < {result['tie_eps']:g}; "
          "smallest gap)")
    for e in result["prompts"]:
        ties = e["routing_ties"]
        cells = [f"{e[r]['first_diff']}, {e[r]['max_lp_gap']:.1e}" for r in refs]
        gap = "-" if ties["min_gap"] is None else f"{ties['min_gap']:.1e}"
        print(f"{e['len']:10d} | " + " | ".join(cells) + f" | {ties['positions']}; {gap}")
    print(f"positions a routing tie excuses: {result['excused_fraction']:.1%}")
    if "bf16_counted" in result:
        errs = {name: [x for e in result["prompts"] for x in e[r][key]] for name, r, key in (
            ("plugin", "dense_float64", "lp_gaps"), ("transformers", f"hf_{result['dtype']}",
                                                      "tok_err"))}
        print("bf16 logprob error at the plugin's tokens vs float64, median / 90th percentile: "
              + "; ".join(f"{k} {quantile(v, 0.5):.3g} / {quantile(v, 0.9):.3g}"
                          for k, v in errs.items()))
        print("positions the per-position rule counts: " + (
            f"{result['bf16_counted']:.0%}" if not result["routed"] else
            "none (top-k routing: distribution only)"))
    print("verdict: " + ("not judged (bf16 needs transformers bf16: drop --no-hf)"
                         if result["failures"] is None else "PASS" if not result["failures"] else
                         "FAIL\n  " + "\n  ".join(result["failures"][:12])))
    if "layers" in result:
        lay = result["layers"]
        print(f"layer mode, prompt {lay['prompt']} ({lay['len']} tokens): first departure "
              f"{lay['first']}")
        rt = lay["routing"]
        ties = sum(f["tie"] for f in rt["flips"])
        print(f"  router logits: max |plugin - float64| {rt['max_router_logit_err']:.1e}; "
              f"expert choices that differ: {len(rt['flips'])} ({ties} at routing ties)"
              + (f", first {rt['flips'][:3]}" if rt["flips"] else ""))
        print("  part          relative error vs float64: max, median | run-dtype "
              "transformers: max, median | first bad position")
        for row in lay["table"]:
            print(f"  {row['part']:12s}  {row['max_err']:.2e}, {row['median_err']:.2e} | "
                  f"{row['max_noise']:.2e}, {row['median_noise']:.2e} | "
                  f"{row['first_bad_position']}")


def corrupt(kind: str) -> None:
    """Negative controls (test-only patches of the plugin, in this process): ``conv-taps``
    feeds the GDN conv its taps in reverse order (what repacked taps look like);
    ``attn-scale`` makes the plugin's attention backend scale scores by 1.05x too much;
    ``slot-mapping`` breaks the NPU platform's slot-mapping substitute of vLLM's Triton
    kernel (every token's KV one slot further), which the emulated engine runs."""
    from vllm_ascend_ext.attention.gdn import layer as gdn_layer

    if kind == "conv-taps":
        original = gdn_layer.conv_taps
        gdn_layer.conv_taps = lambda conv1d: original(conv1d).flip(0)
    elif kind == "attn-scale":
        from vllm_ascend_ext.attention.fia import impl

        init = impl.AscendFIAImpl.__init__

        def scaled(self, *args, **kwargs):
            init(self, *args, **kwargs)
            self.scale *= 1.05
        impl.AscendFIAImpl.__init__ = scaled
    elif kind == "slot-mapping":
        from vllm_ascend_ext.worker import kernel_substitutes as ks

        good = ks.SUBSTITUTES[ks.SLOT_MAPPING]

        def shifted(num_tokens, max_num_tokens, qsl, positions, *args, **kwargs):
            good(num_tokens, max_num_tokens, qsl, positions + 1, *args, **kwargs)
        ks.SUBSTITUTES[ks.SLOT_MAPPING] = shifted
    else:
        raise SystemExit(f"unknown --corrupt {kind}")

if __name__ == "__main__":
    main()
