"""The report a nightly publishes: ``report.md`` (markdown tables), ``speed.png`` (the
feature-on / feature-off ratio per model and metric, with the gates) and
``results.json`` (everything, machine-readable)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from tests.e2e.nightly.gates import SPEED_METRICS

_LABELS = {"output_throughput": "output tok/s", "mean_tpot_ms": "mean TPOT ms",
           "mean_ttft_ms": "mean TTFT ms", "request_throughput": "req/s"}


def _table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in r) + " |"
            for r in rows]
    return out + [""]


def markdown(res: dict) -> str:
    lines = [f"# vllm-ascend-ext nightly ({res['mode']})", "",
             f"{res['started']} · {res['host']}", ""]
    if res["mode"] == "dry run":
        lines += ["Dry run: the whole suite on the CPU in emulation with the embedded tiny "
                  "models. Accuracy gates are replaced by equality with the baseline run "
                  "(plugin off where vLLM can serve the model on a CPU); speed is reported, "
                  "not gated.", ""]
    lines += ["## Stages", ""]
    lines += _table(["stage", "result", "seconds", "detail"],
                    [[s["name"], s["status"].upper(), f"{s['seconds']:.0f}", s["detail"]]
                     for s in res["stages"]])
    if res["gates"]:
        lines += ["## Accuracy and equality gates", ""]
        lines += _table(["model", "setting", "gate", "result", "detail"],
                        [[g["model"], g["setting"], g["gate"], "PASS" if g["ok"] else "FAIL",
                          g["detail"]] for g in res["gates"]])
    if res["speed"]:
        lines += ["## Speed (`bench serve`)", "",
                  "Each repetition serves the same random prompts to the feature-off and the "
                  "feature-on server; a pair's ratio is on / off.", ""]
        rows = []
        for s in res["speed"]:
            for i, run in enumerate(s["runs"]):
                rows.append([s["model"], s["setting"], i + 1, f"{run['request_throughput']:.2f}",
                             f"{run['output_throughput']:.1f}", f"{run['mean_ttft_ms']:.1f}",
                             f"{run['mean_tpot_ms']:.2f}"])
        lines += _table(["model", "setting", "rep", "req/s", "output tok/s", "mean TTFT ms",
                         "mean TPOT ms"], rows)
        lines += ["| model | feature | metric | median ratio on/off | gate | result |",
                  "|---|---|---|---|---|---|"]
        for c in res["comparisons"]:
            for metric, v in c["metrics"].items():
                result = ("PASS" if v["ok"] else "FAIL") if c["gated"] else "reported"
                lines.append(f"| {c['model']} | {c['feature']} {c['on']} vs {c['off']} | "
                             f"{_LABELS[metric]} | {v['ratio']:.3f} | {v['detail']} | {result} |")
        lines += ["", "![speed](speed.png)", ""]
    if res.get("sweep"):
        lines += ["## FIA split sweep (`benchmarks/fia_split_sweep.py`)", "", "```text",
                  res["sweep"].rstrip(), "```", ""]
    verdict = "PASSED" if res["passed"] else "FAILED"
    lines += [f"**{verdict}**: {sum(s['status'] == 'pass' for s in res['stages'])} stages "
              f"passed, {sum(s['status'] == 'fail' for s in res['stages'])} failed, "
              f"{sum(s['status'] == 'skip' for s in res['stages'])} skipped.", ""]
    return "\n".join(lines)


def png(res: dict, path: Path) -> None:
    """One bar per (model, feature, metric): the median on/off ratio, the metric's gate
    as a red tick (the chart is drawn when there is nothing to compare, too)."""
    from PIL import Image, ImageDraw

    bars = [(f"{c['model']} {c['feature']} {c['on']}/{c['off']} {_LABELS[m]}", v["ratio"], m)
            for c in res["comparisons"] for m, v in c["metrics"].items()]
    row, w, x0, span = 22, 1000, 560, 400
    img = Image.new("RGB", (w, row * (len(bars) + 2) + 8), "white")
    dr = ImageDraw.Draw(img)
    dr.text((5, 4), "median pair ratio feature-on / feature-off (1.0 = equal; red: gate)",
            fill="black")
    finite = [abs(r - 1) for _, r, _ in bars if math.isfinite(r)]
    scale = span / 2 / max([0.1, *finite, *(a for _, a in SPEED_METRICS.values())])
    dr.line([(x0, row), (x0, img.height)], fill="black")
    for i, (label, r, metric) in enumerate(bars):
        y = row * (i + 1) + 4
        dr.text((5, y + 4), f"{label}  {r:.3f}", fill="black")
        if not math.isfinite(r):
            continue
        direction, allowed = SPEED_METRICS[metric]
        better = r >= 1 if direction == "higher" else r <= 1
        end = x0 + (r - 1) * scale
        dr.rectangle([min(x0, end), y + 3, max(x0, end), y + row - 3],
                     fill=(40, 140, 60) if better else (200, 120, 40))
        gate = x0 + (-allowed if direction == "higher" else allowed) * scale
        dr.line([(gate, y), (gate, y + row)], fill=(200, 0, 0), width=2)
    img.save(path)


def write(res: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1))
    png(res, out / "speed.png")
    (out / "report.md").write_text(markdown(res))
