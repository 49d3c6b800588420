"""The NPU software stack the plugin runs on, checked at start on an NPU host (pure).

vLLM 0.32 runs on torch 2.13; torch_npu is built per torch minor version (the torch-npu
2.13.0 wheel requires ``torch==2.13.0.*``), and its operators' current schemas need a
recent CANN: the newest line its wheel's README pairs with a torch_npu release is CANN
8.5.0, and its own Meta kernels branch on CANN 8.5.0.alpha003.
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from vllm_ascend_ext.errors import AscendExtError

TORCH_LINE = "2.13"
MIN_CANN = "8.5.0"
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
