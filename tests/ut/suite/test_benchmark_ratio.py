"""The throughput benchmark prints no ratio its pairs cannot support."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "emulated_throughput", Path(__file__).resolve().parents[3] / "benchmarks" / "emulated_throughput.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_too_few_pairs_give_no_ratio():
    # the pairs measured on a loaded machine: 7.44 from one pair, 0.30 from three
    assert bench.ratio_summary([7.44]) == (None, "n/a (1 pair < 5)")
    assert bench.ratio_summary([0.08, 3.15, 0.30])[0] is None


def test_scattered_pairs_are_noise_and_steady_pairs_a_median_with_their_spread():
    value, text = bench.ratio_summary([0.08, 3.15, 0.30, 1.2, 0.5])
    assert value is None and text.startswith("noise (IQR")
    value, text = bench.ratio_summary([0.85, 0.81, 0.81, 0.91, 0.64, 0.89, 0.98, 0.93, 0.92])
    assert value == pytest.approx(0.89) and text == "0.89 (IQR 0.81-0.92)"
