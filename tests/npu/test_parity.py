"""NPU parity: FIA and the K/V cache writer against their references.

Skipped without an Ascend NPU (and torch_npu). On an Atlas 800 this is the first
suite the nightly runs; each test prints what it measured. The cases live in
``vllm_ascend_ext/tools/npu_parity.py`` (``doctor --smoke`` runs one of each).
"""

from __future__ import annotations

import pytest

from vllm_ascend_ext.platform.probe import npu_present
from vllm_ascend_ext.tools import npu_parity

pytestmark = [pytest.mark.npu,
              pytest.mark.skipif(not npu_present(), reason="needs an Ascend NPU and torch_npu")]


def _check(measured):
    for m in measured:
        print(m)
    assert all(m.ok for m in measured), [str(m) for m in measured if not m.ok]


@pytest.mark.parametrize("d,gqa,bs,pad", [(128, 1, 128, 0), (128, 4, 128, 0), (64, 2, 128, 0),
                                          (256, 8, 128, 0), (128, 2, 128, 1)])
def test_fia_matches_reference(d, gqa, bs, pad):
    _check(npu_parity.fia(d, gqa, bs, pad))


def test_scatter_pa_kv_cache_matches_reference():
    _check(npu_parity.scatter_pa_kv_cache())
