"""Bytes each rank sends and collective calls it makes per MoE layer per step, by MoE
token exchange, for DeepSeek-V3.2 and Qwen3-30B-A3B widths on 16 NPUs.

    python benchmarks/moe_exchange_bytes.py [--tokens 256] [--json]

``--tokens`` is the tokens one DP engine runs in the step (decode: its batch size).
Hardware-independent: the figures are the payloads of the calls the code path makes,
with the wire bytes of the usual ring algorithms (all-gather / reduce-scatter of ``S``
total bytes over ``n`` ranks: each rank sends ``(n-1)/n * S``; all-reduce: twice that).
No timing. Layouts (one Atlas 800 pair, 16 NPUs):

- **TP16** (no EP, no DP): every rank holds a 1/16 slice of every expert; vLLM all-reduces
  the MoE output over the 16 ranks (one call).
- **DP2 x TP8 + EP16, all-gather exchange** (built: ``--enable-expert-parallel``, the
  plugin's MoE methods with vLLM's all-gather / reduce-scatter through
  ``AscendCommunicator``). With DP > 1 and TP > 1 vLLM runs the MoE layers
  sequence-parallel (``use_sequence_parallel_moe``): each TP rank keeps 1/8 of its engine's
  tokens; ``all_gatherv`` of those rows' hidden states and router logits over the 16-rank
  EP group (two calls: the communicator gathers a list tensor by tensor), every rank
  computes its 16 experts for all 16 slices, ``reduce_scatterv`` of the partial outputs
  over the EP group, and the model all-gathers its engine's tokens over TP8.
- **DP2 x TP8 + EP16, all-to-all** (built, opt-in: ``moe_dispatch: "alltoall"``,
  ``moe/alltoall.py``): each TP rank dispatches 1/8 of its engine's tokens; every
  (token, k) row goes to the rank owning its expert (the share that stays local is
  ``1/16``); first each rank's per-expert row counts go to the experts' ranks (an
  all-to-all) and the split sizes are read to the host once; the rows come back the same
  way, and an all-gather over TP8 restores the engine's tokens.
- **MC2** (``npu_moe_distribute_dispatch_v2`` / ``combine_v2``, ``moe/mc2.py``; built for
  float and W8A8 experts on A3, taken where the documented bounds hold, for steps of at
  most 512 tokens per rank): the same rows as all-to-all in two fused kernels, no host
  read. For W8A8 experts the dispatch quantizes the rows (``quant_mode=2``: int8 with a
  float32 scale per row; the "int8 dispatch" row); float experts send bf16.
- **TP16 + EP16, all-reduce** (built: ``--enable-expert-parallel`` without DP, ``auto``):
  every rank holds the same tokens (vLLM 0.32 runs its MoE blocks sequence-parallel only
  with DP), computes its 16 whole experts for all of them, and vLLM all-reduces the
  partial outputs: TP16's bytes and call.
- **TP16 + EP16, all-to-all or MC2 of split tokens** (built, opt-in: ``moe_dispatch:
  "alltoall"`` / ``"mc2"``, ``moe/token_split.py``): each rank dispatches 1/16 of the
  step's tokens, exchanges their rows both ways, then all-gathers the 16 slices so that
  every TP rank holds every token again. DeepSeek-V3.2's MoE block (the plugin's) splits
  before the layer, its shared expert running on the same slice; vLLM's blocks (Qwen MoE,
  Qwen3-Next) hand the layer every token and the layer splits them (``moe/tp_split.py``),
  their shared experts, sliced over TP, adding an all-reduce of their own (Qwen3-Next,
  Qwen1.5/2-MoE; Qwen3-30B-A3B has none). Without that all-reduce, at top-k 8 the rows
  out and back weigh as much as the all-reduce's first half and the all-gather as its
  second: the same bytes in three or four calls instead of one (and a host read for the
  all-to-all); MC2 with bf16 rows likewise (not tabled). Only MC2's int8 dispatch (W8A8,
  the tabled MC2 row) saves: an eighth of the bytes, which is why ``auto`` keeps the
  all-reduce there; with it (Qwen3-Next) the split costs about twice the bytes.

Routing is taken as uniform (each of a token's k rows on any rank with probability 1/16);
real routing moves the all-to-all figures, not the all-gather ones. The 16 ranks serve one
engine's tokens under TP16 and two engines' under DP2: "per served token" compares the
layouts at the same throughput. What bytes leave out: under TP16 each rank runs every
expert at 1/16 of its intermediate size (DeepSeek-V3.2: 2048 / 16 = 128 columns per GEMM),
under EP16 16 whole experts.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, replace

RANKS, DP, TP = 16, 2, 8
BF16, FP32, INT8 = 2, 4, 1


@dataclass(frozen=True)
class Widths:
    name: str
    hidden: int
    experts: int
    top_k: int
    moe_layers: int
    # shared experts sliced over TP in vLLM's block: a split layer all-reduces them apart
    shared_all_reduce: bool = False


MODELS = (Widths("DeepSeek-V3.2", 7168, 256, 8, 58),
          Widths("Qwen3-30B-A3B", 2048, 128, 8, 48),
          Widths("Qwen3-Next-80B-A3B", 2048, 512, 10, 48, shared_all_reduce=True))


@dataclass(frozen=True)
class Exchange:
    layout: str
    built: bool
    calls: int
    bytes_sent: float      # per rank, per MoE layer, per step
    host_reads: int        # host reads of device values per MoE layer

    served_per_step: int = 1   # engines the 16 ranks serve (TP16: one, DP2: two)

    def row(self, tokens: int, widths: Widths) -> dict:
        return {"model": widths.name, "tokens": tokens, "layout": self.layout,
                "built": self.built, "calls": self.calls,
                "MiB_sent_per_layer": self.bytes_sent / 2**20,
                "KiB_per_served_token": self.bytes_sent / (tokens * self.served_per_step) / 2**10,
                "MiB_sent_per_step": self.bytes_sent * widths.moe_layers / 2**20,
                "host_reads": self.host_reads}


def ring_gather(total: float, n: int) -> float:
    """Bytes one rank sends in an all-gather or a reduce-scatter of ``total`` bytes."""
    return (n - 1) / n * total


def ring_all_reduce(total: float, n: int) -> float:
    return 2 * ring_gather(total, n)


def tp16(tokens: int, w: Widths) -> Exchange:
    return Exchange("TP16", True, 1, ring_all_reduce(tokens * w.hidden * BF16, RANKS), 0)


def all_gather_ep(tokens: int, w: Widths) -> Exchange:
    # sequence parallel: each of the 16 ranks contributes tokens / TP rows
    every_row = DP * tokens
    gathered = every_row * (w.hidden + w.experts) * BF16            # hidden + router logits
    sent = (ring_gather(gathered, RANKS) + ring_gather(every_row * w.hidden * BF16, RANKS)
            + ring_gather(tokens * w.hidden * BF16, TP))
    return Exchange("DP2xTP8+EP16 all-gather", True, 4, sent, 0, DP)


def _remote_rows(tokens: int, w: Widths, split: int) -> float:
    """(token, k) rows one rank sends away: its 1/split share of the engine's tokens."""
    return tokens / split * w.top_k * (RANKS - 1) / RANKS


def _split_layout(tokens: int, split: int, w: Widths) -> tuple[str, str, int, int, float]:
    """Label head and tail, engines served, and the extra calls and bytes, for an
    exchange of tokens split over ``split`` ranks: TP8 under DP2 (vLLM's sequence-parallel
    MoE) or all 16 ranks of a TP16 engine (opt-in; a split layer of vLLM's block with
    shared experts adds their all-reduce)."""
    if split == TP:
        return "DP2xTP8+EP16", "", DP, 0, 0.0
    if w.shared_all_reduce:
        return "TP16+EP16", " of split tokens", 1, 1, tp16(tokens, w).bytes_sent
    return "TP16+EP16", " of split tokens", 1, 0, 0.0


def all_to_all_ep(tokens: int, w: Widths, *, split: int = TP) -> Exchange:
    # its int64 row count per expert, each to the rank owning the expert (all-to-all); the
    # rows out and back; an all-gather over the split restores every token on every rank
    head, tail, served, calls, shared = _split_layout(tokens, split, w)
    counts = w.experts * 8 * (RANKS - 1) / RANKS
    rows = _remote_rows(tokens, w, split)
    sent = (counts + 2 * rows * w.hidden * BF16
            + ring_gather(tokens * w.hidden * BF16, split))
    return Exchange(f"{head} all-to-all{tail}", True, 4 + calls, sent + shared, 1, served)


def mc2_ep(tokens: int, w: Widths, *, int8_dispatch: bool, split: int = TP) -> Exchange:
    head, tail, served, calls, shared = _split_layout(tokens, split, w)
    rows = _remote_rows(tokens, w, split)
    dispatch = rows * (w.hidden * INT8 + FP32) if int8_dispatch else rows * w.hidden * BF16
    sent = dispatch + rows * w.hidden * BF16 + ring_gather(tokens * w.hidden * BF16, split)
    label = f"{head} MC2{tail}" + (" (int8 dispatch, W8A8)" if int8_dispatch else "")
    return Exchange(label, True, 3 + calls, sent + shared, 0, served)


def table(tokens: int) -> list[dict]:
    rows = []
    for w in MODELS:
        layouts = (tp16(tokens, w), all_gather_ep(tokens, w), all_to_all_ep(tokens, w),
                   mc2_ep(tokens, w, int8_dispatch=False), mc2_ep(tokens, w, int8_dispatch=True),
                   replace(tp16(tokens, w), layout="TP16+EP16 all-reduce"),
                   all_to_all_ep(tokens, w, split=RANKS),
                   mc2_ep(tokens, w, int8_dispatch=True, split=RANKS))
        ours = [ex.row(tokens, w) for ex in layouts]
        for r in ours:
            r["vs_TP16"] = r["KiB_per_served_token"] / ours[0]["KiB_per_served_token"]
        rows += ours
    return rows


def markdown(rows: list[dict]) -> str:
    out = ["| model | tokens/engine | exchange | built | calls/layer | MiB sent/layer/rank | "
           "MiB sent/step/rank | KiB/served token/layer | vs TP16 per token | host reads/layer |",
           "|---|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['model']} | {r['tokens']} | {r['layout']} | "
                   f"{'yes' if r['built'] else 'projection'} | {r['calls']} | "
                   f"{r['MiB_sent_per_layer']:.2f} | {r['MiB_sent_per_step']:.1f} | "
                   f"{r['KiB_per_served_token']:.1f} | {r['vs_TP16']:.2f} | {r['host_reads']} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[16, 256, 4096])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [r for t in args.tokens for r in table(t)]
    print(json.dumps(rows, indent=1) if args.json else markdown(rows))


if __name__ == "__main__":
    main()
