"""Pure comparisons behind ``hybrid_compare.py`` (no vLLM, no model): tokens and logprobs
against references, routing ties, layer-by-layer departures, and the pass/fail rules.

Positions. A prompt of ``n`` tokens followed by generated tokens ``g_0 .. g_{G-1}`` is one
sequence; position ``p`` holds its ``p``-th token, and generated token ``i`` is predicted
from position ``n - 1 + i``. Routing ties and layer outputs are indexed by position.
"""

from __future__ import annotations

import torch

PARTS = ("mixer", "mlp", "stream")
FP32_LOGPROB_TOL = 1e-4      # the bound, fp32 against every reference
FP32_TIE_EPS = 1e-4          # router-logit gap: 4x the largest fp32 router error measured
BF16_TIE_EPS = 0.25          # bf16 router logits are off by up to ~0.7 (measured)
BF16_ERR_FLOOR = 2e-3        # under it a bf16 logprob error is rounding whatever its ratio
# bf16 recurrent states (as on an NPU) rounded at different places by two runs of the tiny
# hybrid model, whose sharp logits turn that into logprob gaps before any token differs:
# measured up to 0.29 (prefix caching on vs off) and 0.112 (contract mode's torch_npu
# GDN references vs the plugin's own ops).
BF16_STATE_TOL = 0.35


def compare_tokens(tokens: list[int], lps: list[float], ref_lp: torch.Tensor,
                   exact_lp: torch.Tensor) -> dict:
    """One prompt against one reference's teacher-forced logprobs ``[G, V]`` (the
    reference's prediction at every generated position given the plugin's prefix).
    ``exact_lp`` (the float64 model's) measures the reference's own rounding: ``noise`` per
    position is its largest logprob error over both models' top-2 tokens and the plugin's
    token; ``tok_err`` its error at the plugin's token alone (like for like with the
    plugin's own error there, ``lp_gaps`` against the float64 model)."""
    ref_tok = ref_lp.argmax(-1).tolist()
    first = next((i for i, (a, b) in enumerate(zip(tokens, ref_tok)) if a != b), None)
    gaps = [abs(float(ref_lp[i, t]) - lp) for i, (t, lp) in enumerate(zip(tokens, lps))]
    top2 = ref_lp.topk(2, -1)
    margins = (top2.values[:, 0] - top2.values[:, 1]).tolist()
    mine = torch.tensor(tokens)[:, None]
    watch = torch.cat([top2.indices, exact_lp.topk(2, -1).indices, mine], -1)
    noise = (ref_lp.gather(-1, watch) - exact_lp.gather(-1, watch)).abs().amax(-1).tolist()
    tok_err = (ref_lp.gather(-1, mine) - exact_lp.gather(-1, mine)).abs()[:, 0].tolist()
    return {"first_diff": first, "max_lp_gap": max(gaps), "lp_gaps": gaps,
            "ref_tokens": ref_tok, "margins": margins, "noise": noise, "tok_err": tok_err,
            "margin_at_diff": None if first is None else margins[first]}


def routing_gaps(router_logits: dict[int, torch.Tensor], top_k: int) -> torch.Tensor:
    """Per MoE layer and position, the router-logit gap between the k-th and (k+1)-th
    expert ``[layers, P]``. Where it is below the compute precision, rounding alone picks
    either expert (a routing tie). Logits, not probabilities: when the top expert takes
    nearly all the mass the others' probabilities are close in absolute terms but not in
    order (and their weights, and a flip's effect, are as small)."""
    gaps = []
    for logits in router_logits.values():
        if logits.shape[-1] > top_k:
            top = logits.topk(top_k + 1, -1).values
            gaps.append(top[:, top_k - 1] - top[:, top_k])
    return torch.stack(gaps) if gaps else torch.empty(0, 0)


def tie_positions(gaps: torch.Tensor, eps: float) -> list[int]:
    return (gaps < eps).any(0).nonzero().flatten().tolist() if gaps.numel() else []


def first_excused(prompt_len: int, ties: list[int]) -> int | None:
    """The first generated index a routing tie may have influenced: a tie at position p
    reaches every later position (through the recurrent state and the KV cache)."""
    if not ties:
        return None
    return max(min(ties) - (prompt_len - 1), 0)


def fp32_failures(result: dict, lp_tol: float = FP32_LOGPROB_TOL) -> list[str]:
    """Every generated token equal to every reference's and every logprob within the
    tolerance of every reference, up to the first position a routing tie may have
    influenced. The tolerance is ``lp_tol``, or twice transformers-fp32's own largest
    logprob error against the float64 model on that prompt when that is larger: deeper
    models accumulate more fp32 rounding than 1e-4 (8 layers, 500 tokens: up to 2.4e-4 in
    transformers itself), and the plugin is held to fp32 noise, not below it."""
    bad = []
    for e in result["prompts"]:
        stop = first_excused(e["len"], e["routing_ties"]["positions"])
        upto = len(e["tokens"]) if stop is None else stop
        fp32_noise = max(e["hf_float32"]["noise"][:upto], default=0.0) if "hf_float32" in e else 0.0
        tol = max(lp_tol, 2 * fp32_noise)
        for ref in (k for k in e if k.startswith(("dense_", "hf_"))):
            r = e[ref]
            if r["first_diff"] is not None and r["first_diff"] < upto:
                bad.append(f"prompt of {e['len']} tokens: generated token {r['first_diff']} "
                           f"differs from {ref} (its top-2 margin {r['margin_at_diff']:.3g})")
            worst = max(r["lp_gaps"][:upto], default=0.0)
            if worst > tol:
                bad.append(f"prompt of {e['len']} tokens: logprob gap {worst:.2e} to {ref} "
                           f"> {tol:.2g}")
    return bad


def excused_fraction(result: dict) -> float:
    """Share of generated positions a routing tie excuses (reported, and bounded by tests
    so that the rules cannot turn vacuous)."""
    total = excused = 0
    for e in result["prompts"]:
        n = len(e["tokens"])
        stop = first_excused(e["len"], e["routing_ties"]["positions"])
        total += n
        excused += 0 if stop is None else n - min(stop, n)
    return excused / max(total, 1)


def quantile(xs: list[float], q: float) -> float:
    return float(torch.tensor(xs, dtype=torch.float64).quantile(q))


def bf16_failures(result: dict, ref: str = "hf_bfloat16") -> list[str]:
    """bf16 against the float64 model, with transformers bf16 as the measure of bf16
    rounding on the same prefixes.

    Distribution (every model): the plugin's logprob error at its token, median and 90th
    percentile over all positions, within twice transformers-bf16's error at the same
    tokens.

    Positions (models without discrete routing, ``result["routed"]`` false): a position
    *counts* where the float64 top-2 margin exceeds twice the largest logprob error
    transformers bf16 makes anywhere in the run; counted positions must carry the float64
    model's token. With top-k routing there is no such bound: at bf16 resolution most
    positions are routing near-ties, an expert flip moves a tiny model's logits by whole
    units, and which positions flip differs between two correct bf16 implementations
    (measured: transformers bf16 itself departs by up to 15 where the plugin does not)."""
    bad = []
    prompts = result["prompts"]
    plugin_err = [x for e in prompts for x in e["dense_float64"]["lp_gaps"]]
    ref_err = [x for e in prompts for x in e[ref]["tok_err"]]
    for q, name in ((0.5, "median"), (0.9, "90th percentile")):
        mine, theirs = quantile(plugin_err, q), quantile(ref_err, q)
        if mine > max(2 * theirs, BF16_ERR_FLOOR):
            bad.append(f"bf16 logprob error, {name}: {mine:.3g} > twice transformers "
                       f"bf16's ({theirs:.3g})")
    if result.get("routed", True):
        return bad
    bound = 2 * max(x for e in prompts for x in e[ref]["noise"])
    for e in prompts:
        exact = e["dense_float64"]
        for i, tok in enumerate(e["tokens"]):
            if exact["margins"][i] > bound and tok != exact["ref_tokens"][i]:
                bad.append(f"prompt of {e['len']} tokens: generated token {i} differs from "
                           f"float64 where the margin {exact['margins'][i]:.2f} exceeds twice "
                           f"bf16's largest error ({bound / 2:.2f})")
    return bad


def bf16_counted(result: dict, ref: str = "hf_bfloat16") -> float:
    """Share of positions the bf16 per-position rule counts (tests keep it non-vacuous)."""
    prompts = result["prompts"]
    bound = 2 * max(x for e in prompts for x in e[ref]["noise"])
    margins = [m for e in prompts for m in e["dense_float64"]["margins"]]
    return sum(m > bound for m in margins) / max(len(margins), 1)


# ------------------------------------------------------------------------ layer by layer
def relative_errors(got: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per position: max |got - ref| over the hidden dim / rms(ref)."""
    scale = ref.pow(2).mean(-1).sqrt().clamp_min(1e-30)
    return (got - ref).abs().amax(-1) / scale


def first_departure(plugin: dict, exact: dict, ref_run: dict, n_layers: int,
                    factor: float, floor: float) -> dict:
    """The first position where some layer part departs from the float64 model by more
    than ``factor`` times the run-dtype reference's own error there (and ``floor``), and
    the lowest such part at that position; a part table with both errors' maxima and
    medians."""
    table, first = [], None
    for i in range(n_layers):
        for part in PARTS:
            name = f"L{i}.{part}"
            got = plugin[name][: exact[name].shape[0]]
            err = relative_errors(got, exact[name])
            noise = relative_errors(ref_run[name], exact[name])
            seen = ~torch.isnan(err)
            bad = (err > torch.clamp(factor * noise, min=floor)) & seen
            where = bad.nonzero().flatten().tolist()
            table.append({"part": name, "max_err": float(err[seen].max()),
                          "median_err": float(err[seen].median()),
                          "max_noise": float(noise.max()), "median_noise": float(noise.median()),
                          "first_bad_position": where[0] if where else None})
            if where and (first is None or where[0] < first["position"]):
                first = {"position": where[0], "part": name, "err": float(err[where[0]]),
                         "noise": float(noise[where[0]])}
    return {"first": first, "table": table}


def routing_report(plugin: dict, exact_routers: dict[int, torch.Tensor], top_k: int,
                   tie_eps: float) -> dict:
    """Where the plugin's expert choice differs from the float64 model's, with the float64
    logit gap there (a tie when below ``tie_eps``), and the largest router-logit error."""
    flips, max_err = [], 0.0
    for i, ref in exact_routers.items():
        got = plugin.get(f"L{i}.router")
        if got is None:
            continue
        got = got[: ref.shape[0]]
        seen = ~torch.isnan(got).any(-1)
        max_err = max(max_err, float((got[seen] - ref[seen]).abs().max()))
        gaps = routing_gaps({i: ref}, top_k)[0]
        mine = got.nan_to_num(0).topk(top_k, -1).indices.sort(-1).values
        theirs = ref.topk(top_k, -1).indices.sort(-1).values
        for pos in ((mine != theirs).any(-1) & seen).nonzero().flatten().tolist():
            flips.append({"layer": i, "position": pos, "float64_gap": float(gaps[pos]),
                          "tie": float(gaps[pos]) < tie_eps})
    return {"max_router_logit_err": max_err, "flips": flips}
