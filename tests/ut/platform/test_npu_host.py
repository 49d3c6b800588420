"""NPU-host facts read without the NPU runtime, and the stack check (pure parsers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_ascend_ext.platform import npu_host
from vllm_ascend_ext.platform.npu import AscendNPUPlatform
from vllm_ascend_ext.platform.versions import NpuStackError, check_npu_stack

# npu-smi output shapes as vllm-ascend's setup.py parses them (fields "Key : value").
A2_CHIP = """
        NPU ID                         : 0
        Chip ID                        : 0
        Chip Type                      : Ascend
        Chip Name                      : 910B2
        Chip Version                   : V1
"""
A3_CHIP = """
        Chip Type                      :
        Chip Name                      : Ascend910
        NPU Name                       : 9391
"""
A5_BOARD = """
        Board ID                       : 0x00
        Chip Name                      : Ascend950
        NPU Name                       : PR
"""
A2_B4_1_CHIP = A2_CHIP.replace("910B2", "910B4-1")
BOARD_WITHOUT_CHIP = """
        Board ID                       : 0x02
        PCB ID                         : A
"""


@pytest.mark.parametrize("text,name", [(A2_CHIP, "ascend910b2"), (A3_CHIP, "ascend910_9391"),
                                       (A5_BOARD, "ascend950"), (BOARD_WITHOUT_CHIP, None)])
def test_soc_name_from_npu_smi(text, name):
    assert npu_host.soc_name_from_npu_smi(text) == name


def test_npu_smi_b4_1_name_resolves_to_its_chip():
    from vllm_ascend_ext.platform import soc

    name = npu_host.soc_name_from_npu_smi(A2_B4_1_CHIP)
    assert name == "ascend910b4-1"
    assert soc.from_name(name) == soc.Soc("ascend910b4_1", "A2", 225)


def test_first_npu_id():
    assert npu_host.first_npu_id("  Total Count : 8\n\n  NPU ID : 3\n  Product Name : x") == 3
    assert npu_host.first_npu_id("nothing") is None


def test_cann_version_from_the_toolkit_install_files(tmp_path: Path):
    assert npu_host.cann_version(tmp_path) is None
    (tmp_path / "aarch64-linux").mkdir()
    (tmp_path / "aarch64-linux" / "ascend_toolkit_install.info").write_text(
        "package_name=Ascend-cann-toolkit\nversion=8.5.0\ninnerversion=V100R001C25\n")
    assert npu_host.cann_version(tmp_path) == "8.5.0"
    assert npu_host.cann_version_from_info("Version=8.3.RC1\n") == "8.3.RC1"


def test_distribution_version_without_import():
    assert npu_host.distribution_version("torch") is not None
    assert npu_host.distribution_version("no-such-distribution-ascend-ext") is None


@pytest.mark.parametrize("torch_v,npu_v,cann,needle", [
    ("2.12.0", "2.12.0", "8.5.0", "need torch 2.13.x"),
    ("2.13.0", None, "8.5.0", "torch_npu is not installed: pip install"),
    ("2.13.0", "2.9.0.post1", "8.5.0", "torch_npu 2.9.0.post1 does not match torch 2.13.0"),
    ("2.13.0", "2.13.0", None, "no CANN toolkit found"),
    ("2.13.0", "2.13.0", "8.3.RC1", "CANN 8.3.RC1 is older than 8.5.0"),
    ("2.13.0", "2.13.0", "8.5.0.alpha003", "CANN 8.5.0.alpha003 is older than 8.5.0"),
])
def test_stack_mismatches_are_refused_with_versions_and_the_fix(torch_v, npu_v, cann, needle):
    with pytest.raises(NpuStackError, match=needle.replace(".", r"\.").replace("(", r"\(")):
        check_npu_stack(torch_v, npu_v, cann)


@pytest.mark.parametrize("cann", ["8.5.0", "8.5.1", "9.0.0.beta1"])
def test_a_matching_stack_passes(cann):
    check_npu_stack("2.13.0+cpu", "2.13.0", cann)
    check_npu_stack("2.13.1", "2.13.0.post2", cann)


def test_npu_platform_soc_never_starts_the_runtime(monkeypatch):
    monkeypatch.setenv("ASCEND_EXT_SOC", "ascend910_9391")
    assert AscendNPUPlatform.soc().family == "A3"
    monkeypatch.delenv("ASCEND_EXT_SOC")
    monkeypatch.setattr(npu_host, "query_soc_name", lambda: "ascend950")
    assert AscendNPUPlatform.soc().family == "A5"
    monkeypatch.setattr(npu_host, "query_soc_name", lambda: None)
    with pytest.raises(Exception, match="cannot tell this host's Ascend SoC.*ASCEND_EXT_SOC"):
        AscendNPUPlatform.soc()


def test_cann_pairing_note_names_the_release_pairing():
    from vllm_ascend_ext.platform.versions import cann_pairing_note

    assert cann_pairing_note("9.2.0") is None and cann_pairing_note("9.2.1") is None
    assert "release pairing is CANN 9.2.0 (with triton-ascend 3.6.0)" in cann_pairing_note("8.5.0")
    assert "newer than the lines" in cann_pairing_note("9.3.0")
    assert cann_pairing_note(None) is None and cann_pairing_note("8.3.0") is None  # refused
