"""The nightly's gates, as pure functions of what the runs returned.

- **equality** (dry run, tiny models): a setting's greedy completions against the
  baseline run's: the same token ids, and every sampled token's logprob within
  ``tol`` (the engines compute in fp32 on the CPU; their kernels differ in summation
  order only).
- **accuracy** (Atlas 800, real models): GSM8K accuracy on a fixed subset, at least the
  model's stated floor and at most ``ACCURACY_DROP`` below the feature-off setting.
- **speed** (Atlas 800): for each repetition i, the feature-on run's figure over the
  feature-off run's (a pair); the median of the pairs' ratios may regress by at most
  the metric's threshold. In the dry run speed is reported, never gated.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass

# GSM8K: accuracy points a feature setting may lose against the feature-off setting
# (200 questions: 4 questions).
ACCURACY_DROP = 0.02
# bench serve figures: (direction, allowed regression of the median pair ratio).
SPEED_METRICS = {
    "output_throughput": ("higher", 0.03),   # output tokens/s
    "mean_tpot_ms": ("lower", 0.03),         # time per output token
    "mean_ttft_ms": ("lower", 0.05),         # time to first token (noisier: queueing)
}
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


@dataclass(frozen=True)
class Verdict:
    ok: bool
    detail: str


def equality(candidate: list[dict], baseline: list[dict], tol: float, *,
             strict: bool = True) -> Verdict:
    """Each item: ``{"token_ids": [...], "logprobs": [...]}`` for one prompt.

    ``strict``: identical token ids. Otherwise (bf16 on an NPU, where a near-tie may
    flip a later greedy token) the first token must agree and the logprobs are compared
    up to the first divergence."""
    if len(candidate) != len(baseline):
        return Verdict(False, f"{len(candidate)} completions vs {len(baseline)} in the baseline")
    worst, diverged = 0.0, []
    for i, (c, b) in enumerate(zip(candidate, baseline)):
        if c["token_ids"] != b["token_ids"]:
            at = next((j for j, (x, y) in enumerate(zip(c["token_ids"], b["token_ids"]))
                       if x != y), min(len(c["token_ids"]), len(b["token_ids"])))
            if strict or at == 0:
                return Verdict(False, f"prompt {i}: tokens differ from position {at}")
            diverged.append(f"prompt {i} from token {at}")
        else:
            at = len(c["token_ids"])
        for x, y in zip(c["logprobs"][:at], b["logprobs"][:at]):
            worst = max(worst, abs(x - y))
    ok = worst <= tol
    tokens = "tokens identical" if not diverged else "diverged: " + ", ".join(diverged)
    return Verdict(ok, f"{tokens}; max |logprob diff| {worst:.2e} ({'<=' if ok else '>'} {tol:.0e})")


def gsm8k_reference(answer: str) -> str:
    """The number after GSM8K's ``####``."""
    return _normalize(answer.split("####")[-1])


def gsm8k_extract(text: str) -> str | None:
    """The model's answer: the first number after its last "answer is", else its last number."""
    low = text.lower()
    if "answer is" in low:
        found = _NUMBER.findall(low.rsplit("answer is", 1)[1])
        if found:
            return _normalize(found[0])
    found = _NUMBER.findall(text)
    return _normalize(found[-1]) if found else None


def _normalize(number: str) -> str:
    s = number.strip().replace(",", "").rstrip(".")
    try:
        value = float(s)
    except ValueError:
        return s
    return str(int(value)) if value == int(value) else str(value)


def gsm8k_accuracy(outputs: list[str], answers: list[str]) -> float:
    if not answers:
        raise ValueError("no GSM8K questions")
    hits = sum(gsm8k_extract(o) == gsm8k_reference(a) for o, a in zip(outputs, answers))
    return hits / len(answers)


def accuracy(value: float, floor: float, feature_off: float | None) -> Verdict:
    parts, ok = [f"{value:.3f} >= floor {floor:.2f}"], value >= floor
    if not ok:
        parts[0] = f"{value:.3f} < floor {floor:.2f}"
    if feature_off is not None:
        within = value >= feature_off - ACCURACY_DROP
        ok = ok and within
        parts.append(f"{'within' if within else 'more than'} {ACCURACY_DROP:.2f} of "
                     f"feature-off {feature_off:.3f}")
    return Verdict(ok, "; ".join(parts))


def pair_ratios(on: list[dict], off: list[dict], metric: str) -> list[float]:
    """Per repetition: feature-on figure / feature-off figure."""
    return [a[metric] / b[metric] for a, b in zip(on, off) if b[metric]]


def speed(on: list[dict], off: list[dict]) -> dict[str, tuple[float, Verdict]]:
    """Median pair ratio and verdict per metric."""
    out = {}
    for metric, (direction, allowed) in SPEED_METRICS.items():
        ratios = pair_ratios(on, off, metric)
        if not ratios:
            out[metric] = (float("nan"), Verdict(False, "no pairs"))
            continue
        r = statistics.median(ratios)
        ok = r >= 1 - allowed if direction == "higher" else r <= 1 + allowed
        bound = f">= {1 - allowed:.2f}" if direction == "higher" else f"<= {1 + allowed:.2f}"
        out[metric] = (r, Verdict(ok, f"median of {len(ratios)} pair ratios {r:.3f} "
                                      f"(gate {bound})"))
    return out
