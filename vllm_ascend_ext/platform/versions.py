"""The NPU software stack the plugin runs on, checked at start on an NPU host (pure).

vLLM 0.32 runs on torch 2.13; torch_npu is built per torch minor version (the torch-npu
2.13.0 wheel requires ``torch==2.13.0.*``). Which CANN (Ascend/pytorch's release notes
and compatibility matrix, TorchNPU 26.2.0): the v2.13.0-26.2.0 line is released with CANN
9.2.0 and triton-ascend 3.6.0, and TorchNPU 26.2.X is marked compatible with CANN 8.5.X,
9.0.X, 9.1.X and 9.2.X. So CANN older than 8.5.0 is refused (torch_npu's own Meta
kernels also branch on CANN 8.5.0.alpha003), and anything but the paired 9.2 line is
reported by ``doctor`` as compatible but not the release pairing.
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from vllm_ascend_ext.errors import AscendExtError

TORCH_LINE = "2.13"
MIN_CANN = "8.5.0"
PAIRED_CANN = "9.2.0"            # the CANN release torch-npu 2.13.0 (26.2.0) ships with
NEWEST_COMPATIBLE_CANN_LINE = "9.2"
TRITON_ASCEND = "3.6.0"          # the triton-ascend release paired with torch-npu 2.13.0
INSTALL_HINT = "pip install 'vllm-ascend-ext[npu]' (torch-npu 2.13.x)"


class NpuStackError(AscendExtError):
    pass


def _line(version: str) -> str:
    v = Version(version.split("+")[0])
    return f"{v.major}.{v.minor}"


def _cann(version: str) -> Version:
    return Version(version.replace("-", "."))


def check_npu_stack(torch_version: str, torch_npu_version: str | None,
                    cann_version: str | None) -> None:
    """Refuse a stack the plugin cannot run on, naming the versions and the fix."""
    if _line(torch_version) != TORCH_LINE:
        raise NpuStackError(f"torch {torch_version}: vLLM 0.32 and this plugin need torch "
                            f"{TORCH_LINE}.x")
    if torch_npu_version is None:
        raise NpuStackError(f"torch_npu is not installed: {INSTALL_HINT}")
    if _line(torch_npu_version) != _line(torch_version):
        raise NpuStackError(f"torch_npu {torch_npu_version} does not match torch "
                            f"{torch_version}: {INSTALL_HINT}")
    if cann_version is None:
        raise NpuStackError(
            "no CANN toolkit found (looked for ascend_toolkit_install.info / version.info "
            "under $ASCEND_TOOLKIT_HOME, $ASCEND_HOME_PATH or "
            "/usr/local/Ascend/ascend-toolkit/latest): install CANN >= "
            f"{MIN_CANN} and source its set_env.sh")
    try:
        too_old = _cann(cann_version) < Version(MIN_CANN)
    except InvalidVersion:
        raise NpuStackError(f"CANN version {cann_version!r} is not a version this plugin "
                            "can compare") from None
    if too_old:
        raise NpuStackError(f"CANN {cann_version} is older than {MIN_CANN}, which torch_npu "
                            f"{torch_npu_version} needs: upgrade CANN")


def cann_pairing_note(cann_version: str | None) -> str | None:
    """``doctor``'s note when CANN is compatible but not the line torch-npu 2.13.0 is
    released with (None for the paired 9.2 line, or when there is nothing to compare)."""
    if cann_version is None:
        return None
    try:
        v = _cann(cann_version)
    except InvalidVersion:
        return None
    line = f"{v.major}.{v.minor}"
    if line == NEWEST_COMPATIBLE_CANN_LINE or v < Version(MIN_CANN):
        return None
    if v > Version(NEWEST_COMPATIBLE_CANN_LINE + ".9999"):
        return (f"CANN {cann_version} is newer than the lines TorchNPU 26.2 (torch-npu "
                f"2.13) is marked compatible with (8.5 to {NEWEST_COMPATIBLE_CANN_LINE}); "
                f"its release pairing is CANN {PAIRED_CANN}")
    return (f"CANN {cann_version} is compatible with torch-npu 2.13, whose release pairing "
            f"is CANN {PAIRED_CANN} (with triton-ascend {TRITON_ASCEND})")
