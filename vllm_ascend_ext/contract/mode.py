"""Contract mode: ``ASCEND_EXT_NPU_CONTRACT=1`` on the emulated platform.

Every NPU operator call then takes its real torch_npu call site, the same function and
keyword arguments the NPU path passes, into the process's one harness (pretending the
emulated SoC), which validates it and computes it with the reference. The operators
(``ops/_dispatch.py``) know nothing of it: ``enabled()``, asked by the platform's config
check (and the CLI) before any operator runs, installs the harness as their torch_npu
stand-in. The harness is created on first use and lives as long as the process (it owns
the call counts that the summary line reports).
"""

from __future__ import annotations

from typing import Any

from vllm_ascend_ext import envs
from vllm_ascend_ext.errors import AscendExtError

ENV = envs.NPU_CONTRACT
_HARNESS: list = []  # the process's harness, once created


def enabled() -> bool:
    """True when ``ASCEND_EXT_NPU_CONTRACT=1`` (read by ``envs.npu_contract``, which refuses
    anything but 0 and 1); contract mode then installs itself as the process's torch_npu
    stand-in (``install``): the operators' dispatch never imports the contract."""
    on = envs.npu_contract()
    if on:
        install()
    return on


def install() -> None:
    """Make the process's harness what NPU call sites get for torch_npu in contract mode
    (idempotent; the harness itself is created on the first call)."""
    from vllm_ascend_ext.ops import _dispatch

    _dispatch.install_stand_in(stand_in)
    harness()  # created here, never first inside a compiled model's trace


def stand_in() -> Any:
    """The torch_npu stand-in: the harness's namespace."""
    return harness().namespace


NPU_DTYPES = ("bfloat16", "float16")


def require_npu_dtype(dtype) -> None:
    """Contract mode checks calls as the NPU takes them: the model runs in bf16 or fp16
    (the emulation's fp32 relaxation is for exact tests, never for contract runs)."""
    name = str(dtype).removeprefix("torch.")
    if name not in NPU_DTYPES:
        raise AscendExtError(
            f"{ENV}=1 runs the model as the NPU would, in {' or '.join(NPU_DTYPES)}; the "
            f"model dtype is {name} (pass --dtype bfloat16)")


def log_summary() -> None:
    from vllm.logger import init_logger

    init_logger("vllm.ascend_ext").info(harness().summary())


def harness():
    if not _HARNESS:
        from vllm_ascend_ext.contract.harness import Harness

        _HARNESS.append(Harness(envs.emulated_soc()))
    return _HARNESS[0]
