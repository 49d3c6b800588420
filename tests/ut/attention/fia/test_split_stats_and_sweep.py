"""Split counters and the sweep benchmark's harness (single vs split on one batch)."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from types import SimpleNamespace

import torch

from vllm_ascend_ext.attention.fia.stats import LOG_INTERVAL_S, SplitStats

REPO = Path(__file__).resolve().parents[4]


def test_stats_count_splits_and_declines_and_log_periodically(caplog, monkeypatch):
    st = SplitStats("layers.0")
    for split, reason in [(True, "auto"), (False, "soc A2 not in A5"), (False, "soc A2 not in A5")]:
        st.record(split, reason)
    assert (st.mixed, st.split, dict(st.declined)) == (3, 1, {"soc A2 not in A5": 2})
    assert st.summary() == ("ascend_ext mixed-split: group=layers.0 mixed_steps=3 split=1 "
                            "declined=2 (soc A2 not in A5: 2)")
    logger = logging.getLogger("vllm.ascend_ext")
    monkeypatch.setattr(logger, "propagate", True)
    with caplog.at_level(logging.INFO, logger="vllm.ascend_ext"):
        st.maybe_log(now=st._last_log + 1)  # too soon
        assert "mixed-split" not in caplog.text
        st.maybe_log(now=st._last_log + LOG_INTERVAL_S)
    assert "mixed_steps=3 split=1" in caplog.text


def test_sweep_harness_split_matches_single():
    spec = importlib.util.spec_from_file_location("sweep", REPO / "benchmarks" / "fia_split_sweep.py")
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    assert sweep.local_shape("qwen3.5-397b", 8) == (4, 1, 256)
    b = sweep.make_batch(4, 1, 128, 3, 20, 40, 16, torch.device("cpu"), torch.float32)
    torch.testing.assert_close(sweep.run_split(b), sweep.run_single(b), atol=1e-6, rtol=1e-6)
    args = SimpleNamespace(decodes=2, prefill=8, kv=32, block_size=16, dtype=torch.float32,
                           warmup=0, iters=2)
    gain, single, split, diff = sweep.measure(4, 1, 128, args, torch.device("cpu"))
    assert single > 0 and split > 0 and diff < 1e-5
