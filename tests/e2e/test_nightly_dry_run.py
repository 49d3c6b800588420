"""The nightly Atlas 800 suite, run dry on the CPU exactly as CI and a contributor run it:
``bash tests/e2e/nightly/run.sh --dry-run --out DIR`` must pass every stage (the real
checkpoints skipped, saying why), hold every equality gate against the plugin-off or
feature-off run, and leave the report a nightly publishes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from PIL import Image

from tests.e2e import engine_cache
from tests.e2e.conftest import REPO

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("nightly")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_EXT_", "NIGHTLY_"))}
    env["PYTHON"] = sys.executable  # the interpreter running the tests, whatever is on PATH
    proc = subprocess.run(["bash", "tests/e2e/nightly/run.sh", "--dry-run", "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=2400)
    for log in sorted((out / "logs").glob("*.log")):
        engine_cache.CACHE.count_starts("nightly", log.read_text(errors="replace"))
    return proc, out


def test_dry_run_passes_and_leaves_the_report(dry_run):
    proc, out = dry_run
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    stages = {s["name"]: s["status"] for s in res["stages"]}
    assert list(stages) == ["doctor", "NPU parity suite", "contract-mode smoke",
                            "tiny models served", "real models served",
                            "two-node DP + EP served", "FIA split sweep"]
    assert stages.pop("real models served") == "skip"
    assert set(stages.values()) == {"pass"}, res["stages"]
    md = (out / "report.md").read_text()
    for needle in ("## Stages", "## Accuracy and equality gates", "## Speed (`bench serve`)",
                   "## FIA split sweep", "**PASSED**", "NIGHTLY_DSA_W8A8 is not set"):
        assert needle in md
    for png in ("speed.png", "split_sweep.png"):
        with Image.open(out / png) as img:
            assert img.format == "PNG"


def test_every_setting_equals_its_baseline(dry_run):
    _, out = dry_run
    res = json.loads((out / "results.json").read_text())
    eq = {(g["model"], g["setting"]): g for g in res["gates"] if g["gate"].startswith("equality")}
    assert set(eq) == {("tiny-qwen3", "off"), ("tiny-qwen3", "auto"),
                       ("tiny-qwen-moe", "default"), ("tiny-qwen3-next", "auto"),
                       ("tiny-dsa-w8a8", "auto"), ("tiny-dsa-w8a8-2node", "default")}
    assert eq[("tiny-qwen3", "auto")]["gate"] == "equality with plugin off (stock vLLM)"
    assert eq[("tiny-dsa-w8a8", "auto")]["gate"] == "equality with native"
    assert eq[("tiny-dsa-w8a8-2node", "default")]["gate"] == "equality with one engine"
    assert all(g["ok"] and "tokens identical" in g["detail"] for g in eq.values())
    ran = {(g["model"], g["setting"]): g["ok"] for g in res["gates"] if "split" in g["gate"]}
    assert ran == {("tiny-qwen3", "off"): True, ("tiny-qwen3", "auto"): True,
                   ("tiny-qwen3-next", "off"): True, ("tiny-qwen3-next", "auto"): True}


def test_the_features_really_ran_and_speed_is_reported_not_gated(dry_run):
    _, out = dry_run
    res = json.loads((out / "results.json").read_text())
    # mixed_split=auto on the emulated Ascend 950 split every mixed step; off split none.
    auto = (out / "logs" / "tiny-qwen3-auto.log").read_text()
    off = (out / "logs" / "tiny-qwen3-off.log").read_text()
    splits = [int(n) for n in re.findall(r"mixed_steps=\d+ split=(\d+)", auto)]
    assert splits and min(splits) > 0, auto[-3000:]
    assert re.findall(r"mixed_steps=(\d+) split=0 ", off)
    comps = {(c["model"], c["feature"]) for c in res["comparisons"]}
    assert comps == {("tiny-qwen3", "mixed_split"), ("tiny-qwen3-next", "mixed_split"),
                     ("tiny-dsa-w8a8", "sfa.preprocess")}
    assert not any(c["gated"] for c in res["comparisons"])
    for s in res["speed"]:
        assert len(s["runs"]) == 1 and all(r["completed"] == 16 for r in s["runs"])


def test_the_two_node_recipe_served_over_two_processes_and_stopped_cleanly(dry_run):
    """The two-node DP + EP stage: node 1 ran headless as DP rank 1, node 0 served the
    API; both exited 0 on SIGTERM; throughput is reported (gated on an Atlas 800 only)."""
    _, out = dry_run
    res = json.loads((out / "results.json").read_text())
    gates = {g["gate"]: g for g in res["gates"] if g["model"] == "tiny-dsa-w8a8-2node"}
    assert set(gates) == {"serves greedy completions", "equality with one engine",
                          "output throughput", "both nodes stop cleanly"}
    assert all(g["ok"] for g in gates.values()), gates
    assert gates["both nodes stop cleanly"]["detail"].startswith("exit codes [0, 0]")
    assert "reported, not gated" in gates["output throughput"]["detail"]
    node1 = (out / "logs" / "tiny-dsa-w8a8-2node-node1.log").read_text()
    assert "--headless" in node1.splitlines()[0]
    assert "--data-parallel-start-rank 1" in node1.splitlines()[0]
    assert any(s["model"] == "tiny-dsa-w8a8-2node" for s in res["speed"])
