"""Explain the mixed-split decision for a model shape: the gate the engine runs.

    python -m vllm_ascend_ext.tools.split_gate --soc ascend950 --head-dim 256 \\
        --q-heads 24 --kv-heads 4 --tp 8 [--decodes 8 --prefill-tokens 2048] [--json]

Heads are the model's (global) counts; ``--tp`` shards them as vLLM does (KV heads
replicate when fewer than the TP degree). Prints the decision and its reason.
"""

from __future__ import annotations

import argparse
import json
import sys

from vllm_ascend_ext.attention.fia.gate import LayerTraits, decide
from vllm_ascend_ext.config import MIXED_SPLIT_CHOICES
from vllm_ascend_ext.platform import soc as soc_table


def local_heads(q_heads: int, kv_heads: int, tp: int) -> tuple[int, int]:
    if tp <= 0 or q_heads % tp:
        raise ValueError(f"--q-heads {q_heads} is not divisible by --tp {tp}")
    if kv_heads >= tp and kv_heads % tp:
        raise ValueError(f"--kv-heads {kv_heads} is not divisible by --tp {tp}")
    return q_heads // tp, max(1, kv_heads // tp)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vllm_ascend_ext.tools.split_gate",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--soc", required=True, help=f"SoC name ({', '.join(soc_table.names())})")
    ap.add_argument("--head-dim", type=int, required=True)
    ap.add_argument("--q-heads", type=int, required=True)
    ap.add_argument("--kv-heads", type=int, required=True)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--mode", choices=MIXED_SPLIT_CHOICES, default="auto",
                    help="ascend_ext.mixed_split")
    ap.add_argument("--decodes", type=int, default=8, help="decode requests in the step")
    ap.add_argument("--prefill-tokens", type=int, default=1024,
                    help="prefill-chunk tokens in the step (0: not a mixed step)")
    ap.add_argument("--batch-invariant", action="store_true")
    ap.add_argument("--sliding-window", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        soc = soc_table.from_name(args.soc)
        q_local, kv_local = local_heads(args.q_heads, args.kv_heads, args.tp)
    except (ValueError, soc_table.UnknownSocError) as exc:
        ap.error(str(exc))
    traits = LayerTraits(head_dim=args.head_dim, local_q_heads=q_local, local_kv_heads=kv_local,
                         sliding_window=args.sliding_window)
    d = decide(args.mode, soc.family, traits, batch_invariant=args.batch_invariant,
               num_decodes=args.decodes, num_prefills=1 if args.prefill_tokens > 0 else 0)
    out = {"split": d.split, "reason": d.reason, "soc": soc.name, "family": soc.family,
           "local_q_heads": q_local, "local_kv_heads": kv_local, "head_dim": args.head_dim,
           "mode": args.mode}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{'split' if d.split else 'single call'}: {d.reason} "
              f"(soc {soc.name}/{soc.family}, head_dim {args.head_dim}, local heads "
              f"{q_local} q / {kv_local} kv, mixed_split={args.mode})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
