"""Emulated plugin vs vLLM's own CPU backend: same offline workload, one run.

    python benchmarks/emulated_throughput.py [--long] [--eager] [--skip-op] [--skip-py] [--rounds N]

Each setting's engine runs in its own subprocess (vLLM picks its platform once
per process): the tiny embedded model, fp32, 32 concurrent prompts of varied
length, chunked prefill. All settings' engines are started and warmed up, then
``--rounds`` rounds (default 15) each run one pass per setting, one engine at a
time, in rotated order; a setting's ratio is the median over rounds of (stock pass
time / its pass time). Pairing passes seconds apart cancels the drift of a shared
machine, which moved whole processes by up to ~20% when each setting had its own
processes in turn. Prints the median throughput of stock vLLM's passes, the
median throughput of the emulated plugin's with its compiled kernels and (unless
``--skip-py``) with the Python references forced (``ASCEND_EXT_PY_REFERENCE=1``),
and their ratios to stock (target: compiled >= 1.0x), each with the interquartile range
of its pairs; a ratio is not printed from fewer than 5 pairs, nor where the pairs' IQR
exceeds half the median (a loaded machine: the cell says "noise"), and every pair is
listed under the table. By default each engine runs as it starts by default (stock vLLM
compiles its model with inductor; the emulated plugin replays decode graphs on its CPU
stand-in); ``--eager`` starts both with ``enforce_eager``. ``--long`` adds the same
comparison with ~2k-token contexts. Unless ``--skip-op``, also times the FIA
operator (Python reference, compiled kernel) against vLLM's CPU attention kernel
on the same batches.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

WORKLOADS = {
    # name: (num prompts, prompt length range, output tokens, token budget, max_model_len)
    "standard": (32, (16, 256), 32, 256, 1024),
    "long-2k": (32, (1536, 2048), 16, 512, 4096),
}


def engine(workload: str, eager: bool = False):
    """The engine of one setting, warmed up; returns a function running one timed pass."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.platforms import current_platform

    from vllm_ascend_ext.models import tiny_model_path

    n, (lo, hi), out_tokens, budget, max_len = WORKLOADS[workload]
    rng = random.Random(0)
    prompts = [TokensPrompt(prompt_token_ids=[rng.randrange(2, 1024) for _ in range(rng.randint(lo, hi))])
               for _ in range(n)]
    llm = LLM(model=tiny_model_path(), dtype="float32", seed=0, max_model_len=max_len,
              max_num_batched_tokens=budget, enable_chunked_prefill=True, max_num_seqs=n,
              enable_prefix_caching=False, enforce_eager=eager)
    sp = SamplingParams(max_tokens=out_tokens, temperature=0.0, ignore_eos=True)
    llm.generate(prompts[:4], sp, use_tqdm=False)  # warm-up (compile, caches)
    llm.generate(prompts, sp, use_tqdm=False)

    def one_pass() -> dict:
        t0 = time.perf_counter()
        outs = llm.generate(prompts, sp, use_tqdm=False)
        dt = time.perf_counter() - t0
        tokens = sum(len(p["prompt_token_ids"]) for p in prompts) + sum(
            len(o.outputs[0].token_ids) for o in outs)
        return {"seconds": dt, "tokens": tokens}

    return type(current_platform).__name__, one_pass


def child(workload: str, eager: bool = False) -> None:
    """Serve passes on request: ``pass`` -> one ``PASS {json}`` line; EOF ends."""
    platform_name, one_pass = engine(workload, eager)
    print("READY " + platform_name, flush=True)
    for line in sys.stdin:
        if line.strip() == "pass":
            print("PASS " + json.dumps(one_pass()), flush=True)


class Child:
    """One setting's engine in its own process (vLLM picks its platform once per process)."""

    def __init__(self, workload: str, emulate: bool, python_refs: bool = False,
                 eager: bool = False):
        env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_EXT_")}
        env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="2",
                   HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_USE_AOT_COMPILE="0")
        if emulate:
            env["ASCEND_EXT_EMULATE"] = "1"
        if python_refs:
            env["ASCEND_EXT_PY_REFERENCE"] = "1"
        self.proc = subprocess.Popen([sys.executable, __file__, "--child", workload]
                                     + (["--eager"] if eager else []), env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        self.platform = self._read("READY ")

    def _read(self, prefix: str) -> str:
        for line in self.proc.stdout:
            if line.startswith(prefix):
                return line[len(prefix):].strip()
        raise RuntimeError(f"benchmark child exited ({self.proc.wait()}) before {prefix!r}")

    def one_pass(self) -> dict:
        self.proc.stdin.write("pass\n")
        self.proc.stdin.flush()
        return json.loads(self._read("PASS "))

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


OP_BATCHES = {
    # name: (query lengths, kv lengths)
    "decode: 32 x kv 2048": ([1] * 32, [2048] * 32),
    "mixed: 31 decodes + 256-token chunk, kv 2048": ([1] * 31 + [256], [2048] * 32),
    "prefill: 2 x 512-token chunks, kv 2048": ([512] * 2, [2048] * 2),
}


def op_compare(q_lens, kv_lens, reps=10) -> dict[str, float]:
    """FIA (Python reference, compiled kernel) vs vLLM's CPU attention kernel, same data."""
    import torch

    from vllm_ascend_ext.attention.kv_layout import plane_block_table, plane_views
    from vllm_ascend_ext.ops.fia import causal_mask_2048, fia_emulated, fia_reference

    torch.manual_seed(0)
    nq, nkv, d, bs = 4, 2, 64, 128
    blocks_per = -(-max(kv_lens) // bs)
    nb = blocks_per * len(q_lens)
    kv_cache = torch.randn(nb, nkv, bs, 2 * d)
    table = torch.arange(nb, dtype=torch.int32).view(len(q_lens), blocks_per)
    T = sum(q_lens)
    q = torch.randn(T, nq, d)
    cu = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    kc, vc, factor = plane_views(kv_cache)
    args = (q, kc.view(kc.shape[0], bs, -1), vc.view(vc.shape[0], bs, -1))
    kw = dict(atten_mask=causal_mask_2048(), actual_seq_lengths=cu[1:].tolist(),
              actual_seq_lengths_kv=kv_lens, block_table=plane_block_table(table, factor),
              num_heads=nq, num_key_value_heads=nkv, scale=d**-0.5, input_layout="TND",
              sparse_mode=3, block_size=bs)
    times = {"reference": _time(lambda: fia_reference(*args, **kw), max(2, reps // 4)),
             "compiled": _time(lambda: fia_emulated(*args, **kw), reps)}
    try:
        from vllm import _custom_ops as ops
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

        isa = _get_attn_isa(torch.float32, bs, d)
        seq = torch.tensor(kv_lens, dtype=torch.int32)
        meta = ops.cpu_attn_get_scheduler_metadata(
            num_reqs=len(q_lens), num_heads=nq, num_kv_heads=nkv, head_dim=d, seq_lens=seq,
            dtype=torch.float32, query_start_loc=cu, causal=True, sliding_window_size=-1,
            isa=isa, enable_kv_split=False)
        kcc, vcc = kv_cache.view(nb, nkv, 2 * bs, d).chunk(2, dim=2)
        out = torch.empty_like(q)

        def stock():
            ops.cpu_attention_with_kv_cache(
                query=q, key_cache=kcc, value_cache=vcc, output=out, query_start_loc=cu,
                seq_lens=seq, scale=d**-0.5, causal=True, alibi_slopes=None, sliding_window=-1,
                block_table=table, softcap=0, scheduler_metadata=meta, s_aux=None)

        times["vllm"] = _time(stock, reps)
    except Exception as exc:  # noqa: BLE001 - report, do not hide, a kernel-API mismatch
        print(f"vLLM CPU attention kernel unavailable ({type(exc).__name__}: {exc})")
        times["vllm"] = float("nan")
    return times


def _time(fn, reps) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2] * 1e3


MIN_PAIRS = 5        # fewer paired passes support no ratio (single pairs scatter 0.1-3x)
MAX_SPREAD = 0.5     # an interquartile range wider than this share of the median: noise


def ratio_summary(ratios: list[float], min_pairs: int = MIN_PAIRS,
                  max_spread: float = MAX_SPREAD) -> tuple[float | None, str]:
    """(the median pair ratio, or None where the pairs cannot support one; its cell text).

    A ratio needs ``min_pairs`` paired passes and an interquartile range within
    ``max_spread`` of the median; otherwise the cell says why, and the pairs (printed
    below the table) are all there is."""
    n = len(ratios)
    if n < min_pairs:
        return None, f"n/a ({n} pair{'s' if n != 1 else ''} < {min_pairs})"
    q1, med, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    if q3 - q1 > max_spread * med:
        return None, f"noise (IQR {q1:.2f}-{q3:.2f})"
    return med, f"{med:.2f} (IQR {q1:.2f}-{q3:.2f})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--long", action="store_true")
    ap.add_argument("--eager", action="store_true", help="both engines with enforce_eager")
    ap.add_argument("--skip-op", action="store_true")
    ap.add_argument("--skip-py", action="store_true")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.eager)
        return
    names = ["standard"] + (["long-2k"] if args.long else [])
    configs = [("stock", False, False), ("compiled", True, False)]
    if not args.skip_py:
        configs.append(("Python refs", True, True))
    print(f"{'workload':<10}" + "".join(f" {name + ' tok/s':>18}" + ("" if name == "stock" else
                                        f" {'ratio (median of pairs)':>24}")
                                        for name, _, _ in configs), flush=True)
    for name in names:
        children = {c: Child(name, emulate, py, args.eager) for c, emulate, py in configs}
        for c, emulate, _ in configs:
            want = "EmulatedAscendPlatform" if emulate else "CpuPlatform"
            assert children[c].platform == want, (c, children[c].platform)
        passes: dict[str, list[dict]] = {c[0]: [] for c in configs}
        for r in range(args.rounds):  # one pass per setting per round, order rotated
            order = list(children)
            for c in order[r % len(order):] + order[:r % len(order)]:
                passes[c].append(children[c].one_pass())
        for ch in children.values():
            ch.close()
        line = f"{name:<10}"
        for cname, _, _ in configs:
            line += f" {statistics.median(p['tokens'] / p['seconds'] for p in passes[cname]):>18.1f}"
            if cname != "stock":
                ratios = [s["seconds"] / p["seconds"] for s, p in zip(passes["stock"], passes[cname])]
                line += f" {ratio_summary(ratios)[1]:>24}"
        print(line, flush=True)
        print("  pair ratios (stock time / setting time, per round): " + "; ".join(
            f"{c} " + " ".join(f"{s['seconds'] / p['seconds']:.2f}"
                               for s, p in zip(passes["stock"], passes[c]))
            for c in passes if c != "stock"), flush=True)
    if not args.skip_op:
        import torch

        print(f"\nFIA operator, median ms ({torch.get_num_threads()} threads; 4 q heads / 2 kv "
              "heads, d 64, fp32, block 128):")
        print(f"{'batch':<46} {'reference':>10} {'compiled':>9} {'vLLM CPU':>9} "
              f"{'ref/comp':>9} {'vLLM/comp':>10}")
        for name, (ql, kl) in OP_BATCHES.items():
            t = op_compare(ql, kl)
            print(f"{name:<46} {t['reference']:>10.2f} {t['compiled']:>9.2f} {t['vllm']:>9.2f} "
                  f"{t['reference'] / t['compiled']:>9.2f} {t['vllm'] / t['compiled']:>10.2f}")


if __name__ == "__main__":
    main()
