"""Facts about an Ascend host, read without starting the NPU runtime.

``torch.npu.get_soc_version()`` initialises the runtime (``_lazy_init``), and torch_npu
lets a process do that once: the API server / engine parent must not, or the workers
vLLM forks inherit a runtime they cannot use. So the SoC comes from the driver's
``npu-smi`` tool (as vllm-ascend's ``setup.py`` reads it), the CANN version from the
toolkit's install files, the package versions from their distribution metadata.
``ASCEND_EXT_SOC`` overrides the SoC. The parsers are pure, for tests.
"""

from __future__ import annotations

import functools
import os
import subprocess
from importlib import metadata
from pathlib import Path

NPU_SMI = "npu-smi"
DEFAULT_TOOLKIT = "/usr/local/Ascend/ascend-toolkit/latest"


def _field(text: str, key: str) -> str:
    for line in text.splitlines():
        line = " ".join(line.split())
        if line.startswith(key) and ":" in line:
            return line.split(":")[-1].strip()
    return ""


def soc_name_from_npu_smi(board: str) -> str | None:
    """The chip name from ``npu-smi info -t board -i <id> [-c 0]`` output: A2
    ``Chip Type`` + ``Chip Name`` (``ascend910b2``), A3 ``Chip Name`` + ``_`` +
    ``NPU Name`` (``ascend910_9391``), Ascend 950 ``ascend950``; None if absent."""
    chip_name, chip_type = _field(board, "Chip Name"), _field(board, "Chip Type")
    npu_name = _field(board, "NPU Name")
    low = chip_name.lower()
    if not chip_name:
        return None
    if "950" in low:
        return "ascend950"
    if "910" in low or "310" in low:
        if chip_type:
            return (chip_type + chip_name).lower()
        if npu_name:
            return f"{chip_name}_{npu_name}".lower()
    return low


def first_npu_id(listing: str) -> int | None:
    """The first ``NPU ID`` of ``npu-smi info -l``."""
    value = _field(listing, "NPU ID")
    return int(value) if value.isdigit() else None


@functools.cache
def query_soc_name() -> str | None:
    """The host's chip name through ``npu-smi`` (None where the tool is missing or fails)."""
    def run(*args: str) -> str:
        return subprocess.run([NPU_SMI, "info", *args], capture_output=True, text=True,
                              check=True, timeout=30).stdout
    try:
        npu = first_npu_id(run("-l"))
        if npu is None:
            return None
        # Ascend 950 boards name the chip directly; A2/A3 name it per chip (-c 0).
        name = soc_name_from_npu_smi(run("-t", "board", "-i", str(npu)))
        if name is None:
            name = soc_name_from_npu_smi(run("-t", "board", "-i", str(npu), "-c", "0"))
        return name
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def cann_version_from_info(text: str) -> str | None:
    """``version=8.5.0`` (``ascend_toolkit_install.info``) or ``Version=8.5.0``
    (``version.info``)."""
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip().lower() == "version" and value.strip():
            return value.strip()
    return None


def toolkit_home() -> Path:
    return Path(os.environ.get("ASCEND_TOOLKIT_HOME") or os.environ.get("ASCEND_HOME_PATH")
                or DEFAULT_TOOLKIT)


def cann_version(home: Path | None = None) -> str | None:
    """The installed CANN toolkit's version, from its install files (None if not found)."""
    home = home or toolkit_home()
    candidates = [*sorted(home.glob("*-linux/ascend_toolkit_install.info")),
                  home / "ascend_toolkit_install.info", home / "runtime" / "version.info",
                  home / "compiler" / "version.info"]
    for path in candidates:
        try:
            found = cann_version_from_info(path.read_text(errors="replace"))
        except OSError:
            continue
        if found:
            return found
    return None


def distribution_version(name: str) -> str | None:
    """An installed distribution's version, without importing it (None if absent)."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
