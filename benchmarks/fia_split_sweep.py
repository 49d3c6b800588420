"""Single vs split FIA calls on mixed batches, across local attention shapes.

    python benchmarks/fia_split_sweep.py [--decodes 16 --prefill 512 --kv 1024 --iters 10]
        [--target 0.05] [--png gain.png] [--shapes qwen3-8b:tp1,qwen3.5-397b:tp8]

For each local shape (model head config sharded by a TP degree) one mixed batch
(decode requests beside one prefill chunk, all on a paged cache) is attended with
one FIA call and with the decode/prefill split; warm-up, then paired timed
iterations (alternating order). Reports per-shape median gain and max abs
difference, a one-sided Wilcoxon signed-rank test of "gain > target" across shapes
(the methodology of sglang PR 34387), a gain-vs-prefill-span table, and a PNG bar
chart. On an NPU the torch_npu operator runs; elsewhere the reference does, and its
timings only validate the harness (they say nothing about NPU kernels).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import torch

from vllm_ascend_ext.attention.fia.split import find_boundary, spans
from vllm_ascend_ext.ops.fia import causal_mask_2048, npu_fused_infer_attention_score

# (model, q heads, kv heads, head_dim): Qwen3 dense (d128) and Qwen3.5/Qwen3-Next
# full-attention layers (d256).
MODELS = {
    "qwen3-8b": (32, 8, 128),
    "qwen3-32b": (64, 8, 128),
    "qwen3-235b": (64, 4, 128),
    "qwen3-next-80b": (16, 2, 256),
    "qwen3.5-397b": (32, 2, 256),
}
TPS = (1, 2, 4, 8)


def local_shape(model: str, tp: int) -> tuple[int, int, int]:
    q, kv, d = MODELS[model]
    return q // tp, max(1, kv // tp), d


def default_shapes() -> list[str]:
    return [f"{m}:tp{tp}" for m in MODELS for tp in TPS if MODELS[m][0] % tp == 0]


def make_batch(nq, nkv, d, decodes, prefill, kv, bs, device, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q_lens = [1] * decodes + [prefill]
    kv_lens = [kv] * decodes + [kv]
    per = -(-kv // bs)
    nb = per * len(q_lens) + 1
    kc = torch.randn(nb, bs, nkv * d, generator=g).to(dtype)
    vc = torch.randn(nb, bs, nkv * d, generator=g).to(dtype)
    table = torch.randperm(nb, generator=g)[: per * len(q_lens)].view(len(q_lens), per)
    q = torch.randn(sum(q_lens), nq, d, generator=g).to(dtype)
    return dict(q=q.to(device), kc=kc.to(device), vc=vc.to(device),
                table=table.to(torch.int32).to(device), cu=list(itertools.accumulate(q_lens)),
                kv=kv_lens, nq=nq, nkv=nkv, d=d, bs=bs, mask=causal_mask_2048(device))


def _call(b, q, table, cu, kv):
    out, _ = npu_fused_infer_attention_score(
        q, b["kc"], b["vc"], atten_mask=b["mask"], actual_seq_lengths=list(cu),
        actual_seq_lengths_kv=list(kv), block_table=table, num_heads=b["nq"],
        num_key_value_heads=b["nkv"], scale=b["d"] ** -0.5, input_layout="TND",
        sparse_mode=3, block_size=b["bs"])
    return out


def run_single(b):
    return _call(b, b["q"], b["table"], b["cu"], b["kv"])


def run_split(b):
    out = torch.empty(b["q"].shape, dtype=b["q"].dtype, device=b["q"].device)
    for sp in spans(b["cu"], b["kv"], find_boundary(b["cu"], 1)):
        out[sp.tok0:sp.tok1] = _call(b, b["q"][sp.tok0:sp.tok1], b["table"][sp.req0:sp.req1],
                                     sp.actual_seq_lengths_q, sp.actual_seq_lengths_kv)
    return out


def _sync(device):
    if device.type == "npu":
        torch.npu.synchronize()


def paired_times(b, warmup, iters, device):
    for _ in range(warmup):
        run_single(b)
        run_split(b)
    single, split = [], []
    for i in range(iters):
        order = (("single", run_single), ("split", run_split))
        for name, fn in (order if i % 2 == 0 else order[::-1]):
            _sync(device)
            t0 = time.perf_counter()
            fn(b)
            _sync(device)
            (single if name == "single" else split).append(time.perf_counter() - t0)
    return single, split


def measure(nq, nkv, d, args, device, prefill=None):
    b = make_batch(nq, nkv, d, args.decodes, prefill or args.prefill, args.kv, args.block_size,
                   device, args.dtype)
    diff = (run_single(b).float() - run_split(b).float()).abs().max().item()
    single, split = paired_times(b, args.warmup, args.iters, device)
    gains = [(s - p) / s for s, p in zip(single, split)]
    return statistics.median(gains), statistics.median(single), statistics.median(split), diff


def write_png(path, labels, gains, target):
    from PIL import Image, ImageDraw

    w, row = 1000, 22
    img = Image.new("RGB", (w, row * (len(labels) + 2)), "white")
    dr = ImageDraw.Draw(img)
    x0, scale = 620, 340 / max(0.05, max(abs(g) for g in gains), abs(target))
    dr.line([(x0, 0), (x0, img.height)], fill="black")
    tx = x0 + target * scale
    dr.line([(tx, 0), (tx, img.height)], fill=(200, 0, 0))
    for i, (lab, g) in enumerate(zip(labels, gains)):
        y = row * (i + 1)
        dr.text((5, y + 4), f"{lab} {g * 100:+.1f}%", fill="black")
        color = (40, 140, 60) if g > target else (200, 120, 40)
        dr.rectangle([min(x0, x0 + g * scale), y + 3, max(x0, x0 + g * scale), y + row - 3],
                     fill=color)
    dr.text((5, 3), f"median gain per shape (split vs single); red line: target {target:.0%}",
            fill="black")
    img.save(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(default_shapes()))
    ap.add_argument("--decodes", type=int, default=16)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--kv", type=int, default=1024)
    ap.add_argument("--block-size", type=int, default=128)
    ap.add_argument("--spans", default="128,512,2048", help="prefill spans for the span table")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--target", type=float, default=0.05)
    ap.add_argument("--png", default="fia_split_gain.png")
    args = ap.parse_args()
    from vllm_ascend_ext.platform.probe import npu_present

    device = torch.device("npu" if npu_present() else "cpu")
    args.dtype = torch.bfloat16 if device.type == "npu" else torch.float32
    print(f"device: {device.type} ({'torch_npu operator' if device.type == 'npu' else 'REFERENCE operator: timings validate the harness only, not NPU performance'})")
    print(f"batch: {args.decodes} decodes + {args.prefill}-token prefill, kv {args.kv}, "
          f"block {args.block_size}, {args.warmup} warm-up + {args.iters} paired iterations\n")
    print(f"{'shape':<22} {'q/kv/d':>10} {'single ms':>10} {'split ms':>9} {'gain':>7} {'max|diff|':>10}")
    labels, gains = [], []
    for spec in args.shapes.split(","):
        model, tp = spec.split(":tp")
        nq, nkv, d = local_shape(model, int(tp))
        g, s, p, diff = measure(nq, nkv, d, args, device)
        labels.append(spec)
        gains.append(g)
        print(f"{spec:<22} {f'{nq}/{nkv}/{d}':>10} {s * 1e3:>10.2f} {p * 1e3:>9.2f} "
              f"{g * 100:>+6.1f}% {diff:>10.2e}")
    above = sum(g > args.target for g in gains)
    print(f"\nshapes above target {args.target:.0%}: {above}/{len(gains)}")
    try:
        from scipy.stats import wilcoxon

        res = wilcoxon([g - args.target for g in gains], alternative="greater")
        print(f"one-sided Wilcoxon signed-rank (H0: gain <= {args.target:.0%}): "
              f"statistic={res.statistic:.1f} p={res.pvalue:.3g}")
    except (ImportError, ValueError) as exc:
        print(f"Wilcoxon test not computed: {exc}")
    first = args.shapes.split(",")[0]
    nq, nkv, d = local_shape(*(lambda m, t: (m, int(t)))(*first.split(":tp")))
    print(f"\ngain vs prefill span ({first}, {args.decodes} decodes, kv {args.kv}):")
    print(f"{'prefill tokens':>15} {'gain':>7}")
    for span in (int(x) for x in args.spans.split(",")):
        g, *_ = measure(nq, nkv, d, args, device, prefill=min(span, args.kv))
        print(f"{span:>15} {g * 100:>+6.1f}%")
    write_png(args.png, labels, gains, args.target)
    print(f"\nplot: {args.png}")


if __name__ == "__main__":
    main()
