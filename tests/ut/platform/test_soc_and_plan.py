"""SoC table and the FIA backend's pure per-step planning."""

from __future__ import annotations

import pytest

from vllm_ascend_ext.attention.fia.plan import BatchMetadataError, host_lists
from vllm_ascend_ext.platform import soc


@pytest.mark.parametrize("version,family", [(220, "A2"), (225, "A2"), (250, "A3"),
                                            (255, "A3"), (260, "A5")])
def test_soc_versions_map_to_families(version, family):
    assert soc.from_version(version).family == family


@pytest.mark.parametrize("name,expected", [("ascend950", "ascend950"), ("A5", "ascend950"),
                                           ("Ascend910B2", "ascend910b2"), ("a3", "ascend910_9391"),
                                           # npu-smi's spelling of the B4-1 chip, and without
                                           # the "ascend" prefix (was refused)
                                           ("Ascend910B4-1", "ascend910b4_1"),
                                           ("910B4-1", "ascend910b4_1"),
                                           ("ascend910_9391", "ascend910_9391"),
                                           ("910_9372", "ascend910_9372")])
def test_soc_names_and_aliases(name, expected):
    assert soc.from_name(name).name == expected


def test_unknown_soc_is_a_clear_error():
    with pytest.raises(soc.UnknownSocError, match="unknown Ascend SoC 'ascend999'.*ascend950"):
        soc.from_name("ascend999")
    with pytest.raises(soc.UnknownSocError, match="did you mean 'ascend950'"):
        soc.from_name("ascend905")
    with pytest.raises(soc.UnknownSocError, match="unsupported Ascend SoC version 104"):
        soc.from_version(104)


def test_host_lists_cumulative_q_and_per_request_kv():
    cu, kv = host_lists([0, 1, 2, 7, 7], [10, 4, 12, 99], num_actual_tokens=8)
    assert cu == (1, 2, 7, 7)
    assert kv == (10, 4, 12, 0)  # the zero-query padding request reads nothing


@pytest.mark.parametrize("qsl,lens,n,needle", [
    ([1, 2], [3], 4, "must start at 0"),
    ([0, 2, 1], [3, 3], 4, "decreases at request 1"),
    ([0, 2], [3, 3], 4, "seq_lens has 2 entries"),
    ([0, 5], [3], 5, "shorter than its 5 query tokens"),
    ([0, 5], [9], 4, "exceeds num_actual_tokens = 4"),
])
def test_inconsistent_batch_metadata_fails_loudly(qsl, lens, n, needle):
    with pytest.raises(BatchMetadataError, match=needle):
        host_lists(qsl, lens, n)
