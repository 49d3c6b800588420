"""The nightly suite's gates and report, on values computed here by hand."""

from __future__ import annotations

import math

import pytest
from PIL import Image

from tests.e2e.nightly import gates, report
from tests.e2e.nightly.models import ServedModel, real_models, tiny_models


def _run(ids, lps):
    return {"token_ids": ids, "logprobs": lps}


def test_equality_passes_identical_tokens_within_tolerance():
    base = [_run([5, 6, 7], [-1.0, -2.0, -0.5]), _run([1], [-3.0])]
    near = [_run([5, 6, 7], [-1.00005, -2.0, -0.5]), _run([1], [-3.0])]
    v = gates.equality(near, base, 1e-4)
    assert v.ok and "5.00e-05" in v.detail


@pytest.mark.parametrize("cand,needle", [
    ([_run([5, 9, 7], [-1.0, -2.0, -0.5]), _run([1], [-3.0])], "prompt 0: tokens differ from position 1"),
    ([_run([5, 6, 7], [-1.0, -2.0, -0.5]), _run([1], [-3.001])], "1.00e-03 (> 1e-04)"),
    ([_run([5, 6, 7], [-1.0, -2.0, -0.5])], "1 completions vs 2"),
    ([_run([5, 6], [-1.0, -2.0]), _run([1], [-3.0])], "tokens differ from position 2"),
])
def test_equality_fails_on_any_difference(cand, needle):
    base = [_run([5, 6, 7], [-1.0, -2.0, -0.5]), _run([1], [-3.0])]
    v = gates.equality(cand, base, 1e-4)
    assert not v.ok and needle in v.detail


@pytest.mark.parametrize("text,expected", [
    ("3 apples + 4 = 7 apples. The answer is 7.", "7"),
    ("so 1,250 in total. The answer is $1,250.", "1250"),
    ("The answer is 12.50 dollars", "12.5"),
    ("we get 42", "42"),
    ("the answer is unclear, maybe 3 or 5", "3"),
    ("no number here", None),
])
def test_gsm8k_answer_extraction(text, expected):
    assert gates.gsm8k_extract(text) == expected


def test_gsm8k_accuracy_against_the_reference_after_hashes():
    answers = ["Janet sells 16 - 3 - 4 = 9 duck eggs...\n#### 18", "#### 1,000", "#### 3"]
    outs = ["The answer is 18.", "The answer is 1000", "The answer is 4"]
    assert gates.gsm8k_accuracy(outs, answers) == pytest.approx(2 / 3)


def test_accuracy_gate_floor_and_drop():
    assert gates.accuracy(0.90, 0.85, None).ok
    assert not gates.accuracy(0.84, 0.85, None).ok
    assert gates.accuracy(0.88, 0.85, 0.895).ok           # 1.5 points below: allowed
    v = gates.accuracy(0.87, 0.85, 0.895)                 # 2.5 points below: refused
    assert not v.ok and "more than 0.02" in v.detail


def _bench(tput, tpot, ttft):
    return {"output_throughput": tput, "mean_tpot_ms": tpot, "mean_ttft_ms": ttft,
            "request_throughput": tput / 32, "completed": 64.0}


def test_speed_gate_takes_the_median_of_paired_ratios():
    off = [_bench(1000, 10.0, 100.0), _bench(1100, 10.0, 100.0), _bench(900, 10.0, 100.0)]
    on = [_bench(1000, 10.2, 100.0), _bench(1045, 10.5, 106.0), _bench(990, 10.2, 104.0)]
    res = gates.speed(on, off)
    # throughput ratios 1.0, 0.95, 1.1 -> 1.0; TPOT 1.02, 1.05, 1.02 -> 1.02; TTFT 1.0, 1.06, 1.04
    assert res["output_throughput"][0] == pytest.approx(1.0) and res["output_throughput"][1].ok
    assert res["mean_tpot_ms"][0] == pytest.approx(1.02) and res["mean_tpot_ms"][1].ok
    assert res["mean_ttft_ms"][0] == pytest.approx(1.04) and res["mean_ttft_ms"][1].ok
    slower = [_bench(950, 10.4, 100.0)] * 3
    res = gates.speed(slower, off)
    assert not res["output_throughput"][1].ok and not res["mean_tpot_ms"][1].ok
    assert "gate >= 0.97" in res["output_throughput"][1].detail


def test_feature_settings_become_additional_config():
    m = ServedModel("m", "/x", "sfa", "sfa.preprocess", ("native", "auto"))
    assert m.additional_config("auto") == {"ascend_ext": {"sfa": {"preprocess": "auto"}}}
    assert ServedModel("m", "/x", "moe").additional_config("default") == {}
    qwen3 = tiny_models()[0]
    assert qwen3.additional_config("off") == {"ascend_ext": {"mixed_split": "off"}}
    assert qwen3.baseline == "stock" and tiny_models(npu=True)[0].baseline is None


def test_real_models_are_skipped_with_the_reason(tmp_path):
    env = {"NIGHTLY_QWEN3": str(tmp_path), "NIGHTLY_HYBRID": str(tmp_path / "missing"),
           "NIGHTLY_DSA_W8A8": str(tmp_path), "NIGHTLY_QWEN3_GSM8K_MIN": "0.8"}
    qwen3, hybrid, dsa = real_models(8, env)
    assert qwen3.skip is None and qwen3.gsm8k_floor == 0.8 and "--tensor-parallel-size" in qwen3.serve_args
    assert "is not a directory" in hybrid.skip
    assert "needs 16 NPUs, this runner has 8" in dsa.skip and "Atlas 800 A2" in dsa.skip
    assert all("is not set" in m.skip for m in real_models(8, {}))


def test_report_writes_markdown_and_a_png(tmp_path):
    ratio = {"ratio": 0.98, "ok": True, "detail": "median of 2 pair ratios 0.980 (gate >= 0.97)"}
    res = {"mode": "dry run", "started": "now", "host": "h", "passed": True, "sweep": "table",
           "stages": [{"name": "doctor", "status": "pass", "detail": "ok", "seconds": 1.0}],
           "gates": [{"model": "m", "setting": "auto", "gate": "equality", "ok": True,
                      "detail": "tokens identical"}],
           "speed": [{"model": "m", "setting": s, "runs": [_bench(1000, 10, 100)]}
                     for s in ("off", "auto")],
           "comparisons": [{"model": "m", "feature": "mixed_split", "on": "auto", "off": "off",
                            "gated": False,
                            "metrics": {"output_throughput": ratio,
                                        "mean_tpot_ms": {**ratio, "ratio": math.nan},
                                        "mean_ttft_ms": ratio}}]}
    report.write(res, tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "| doctor | PASS |" in md and "| m | mixed_split auto vs off | output tok/s | 0.980 |" in md
    assert "reported" in md and "**PASSED**" in md
    with Image.open(tmp_path / "speed.png") as img:
        assert img.format == "PNG" and img.height > 60


def test_npu_equality_allows_a_late_flip_but_not_a_first_token_or_logprob_change():
    base = [_run([5, 6, 7], [-1.0, -2.0, -0.5])]
    late = [_run([5, 6, 9], [-1.01, -2.02, -0.1])]
    v = gates.equality(late, base, 5e-2, strict=False)
    assert v.ok and "prompt 0 from token 2" in v.detail
    assert not gates.equality(late, base, 5e-2).ok                          # strict (CPU)
    assert not gates.equality([_run([4, 6, 7], [-1.0, -2.0, -0.5])], base, 5e-2, strict=False).ok
    assert not gates.equality([_run([5, 6, 9], [-1.2, -2.0, -0.5])], base, 5e-2, strict=False).ok


def test_split_counts_read_the_builders_shutdown_lines(tmp_path):
    from tests.e2e.nightly.suite import split_counts

    log = tmp_path / "s.log"
    log.write_text("x ascend_ext mixed-split: group=a mixed_steps=12 split=12 declined=0 (none)\n"
                   "y ascend_ext mixed-split: group=b mixed_steps=3 split=0 declined=3 (x)\n")
    assert split_counts(log) == [12, 0] and split_counts(tmp_path / "missing.log") == []


def test_feature_on_split_value_follows_the_soc():
    assert tiny_models(npu=True, split_on="on")[0].settings == ("off", "on")
    env = {"NIGHTLY_QWEN3": "/nonexistent"}
    assert real_models(8, env, split_on="on")[0].settings == ("off", "on")
    assert real_models(8, env)[2].settings == ("native", "auto")
