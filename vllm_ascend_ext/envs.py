"""The plugin's environment variables (prefix ``ASCEND_EXT_``, not ``VLLM_``).

vLLM warns about unknown ``VLLM_*`` variables, so the plugin uses its own prefix.
Each is read when asked for, never cached at import. A bad value raises
:class:`AscendExtError` naming the variable, the value and what is allowed.
"""

from __future__ import annotations

import os

from vllm_ascend_ext.errors import AscendExtError

EMULATE = "ASCEND_EXT_EMULATE"
SOC = "ASCEND_EXT_SOC"

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def _flag(name: str) -> bool:
    """A boolean variable: unset / 0 / false / no / off, or 1 / true / yes / on."""
    raw = os.environ.get(name, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise AscendExtError(
        f"{name}={os.environ[name]!r}: expected one of {', '.join(_TRUE + _FALSE[1:])}")


def emulate_requested() -> bool:
    """True when ``ASCEND_EXT_EMULATE`` asks for the emulated (CPU) platform."""
    return _flag(EMULATE)


def emulated_soc_name() -> str | None:
    """The SoC to emulate (``ASCEND_EXT_SOC``), or None for the default."""
    raw = os.environ.get(SOC, "").strip()
    return raw or None


def emulated_soc():
    """The :class:`~vllm_ascend_ext.platform.soc.Soc` to emulate (default: an A2 chip);
    unknown names and families the plugin does not serve are refused."""
    from vllm_ascend_ext.platform import soc as soc_table

    name = emulated_soc_name()
    if name is None:
        return soc_table.from_name(soc_table.DEFAULT_EMULATED_SOC)
    try:
        return soc_table.require_supported(soc_table.from_name(name))
    except soc_table.UnknownSocError as exc:
        raise AscendExtError(f"{SOC}={os.environ[SOC]!r}: {exc}") from None


PY_REFERENCE = "ASCEND_EXT_PY_REFERENCE"


def python_reference_forced() -> bool:
    """True when ``ASCEND_EXT_PY_REFERENCE`` forces the Python references of the emulation
    kernels (``_C_ascend_ext.emu_*``): for debugging, and for the tests comparing them."""
    return _flag(PY_REFERENCE)


NPU_CONTRACT = "ASCEND_EXT_NPU_CONTRACT"


def npu_contract() -> bool:
    """True when ``ASCEND_EXT_NPU_CONTRACT=1`` asks for contract mode: every torch_npu
    call site of the emulated platform runs against the contract harness
    (``contract/mode.py``). Only ``0`` and ``1`` are taken."""
    raw = os.environ.get(NPU_CONTRACT, "").strip()
    if raw in ("", "0"):
        return False
    if raw == "1":
        return True
    raise AscendExtError(f"{NPU_CONTRACT}={raw!r}: expected 0 or 1")


EMULATED_WORKER = "ASCEND_EXT_EMULATED_WORKER"
EMULATED_WORKERS = ("npu", "cpu")


def emulated_worker() -> str:
    """Which worker the emulated platform runs (``ASCEND_EXT_EMULATED_WORKER``): ``npu``
    (default: the plugin's NPU worker and runner on the CPU stand-in device) or ``cpu``
    (vLLM's CPU worker, for comparison with the engine path before the stand-in)."""
    raw = os.environ.get(EMULATED_WORKER, "").strip().lower() or "npu"
    if raw not in EMULATED_WORKERS:
        raise AscendExtError(f"{EMULATED_WORKER}={os.environ[EMULATED_WORKER]!r}: expected "
                             f"one of {', '.join(EMULATED_WORKERS)}")
    return raw


# Read elsewhere, named here so that every variable a user may set is in one table.
EMU_ISA = "ASCEND_EXT_EMU_ISA"              # csrc/emu_attention.cpp
ORACLE_WHEEL = "ASCEND_EXT_ORACLE_WHEEL"    # contract/oracle.py

# Every variable a user may set -> what it means (README's table is this one, checked by
# tests/ut/suite/test_readme_ci.py). Internal ones (the serve supervisor's report pipe) and the
# build's (setup.py, docs/operators.md) are not listed.
DOCUMENTED: dict[str, str] = {
    EMULATE: "`1` selects the emulated platform; any value other than "
             "`0/1/true/false/yes/no/on/off` is an error",
    SOC: "SoC to emulate (table below; default `ascend910b2`); on an NPU host, the SoC to "
         "assume instead of what `npu-smi` reports. Unknown names and unsupported families "
         "fail before the engine starts, naming the variable",
    EMULATED_WORKER: "with emulation: `npu` (default) runs the Atlas engine path, the NPU "
                     "platform with the plugin's NPU worker and runner on the CPU stand-in; "
                     "`cpu` runs vLLM's CPU platform, worker and runner with the plugin's "
                     "backends instead, kept to compare against "
                     "([docs/engine-path.md](docs/engine-path.md)); anything else is an error",
    NPU_CONTRACT: "`1`: NPU contract mode (emulated platform only; "
                  "[docs/contract-mode.md](docs/contract-mode.md)); `0`/unset: off; anything "
                  "else is an error",
    PY_REFERENCE: "`1`: emulation runs the Python references instead of the compiled "
                  "emulation kernels (`_C_ascend_ext.emu_*`, "
                  "[docs/operators.md](docs/operators.md#emulation-kernels)), for debugging "
                  "and for the tests comparing them; `0`/unset: the compiled kernels where "
                  "the library is built; anything else is an error",
    EMU_ISA: "`default`: the compiled emulation kernels take their portable vector path even "
             "on an AVX2 CPU (tests compare the two); unset: AVX2 + FMA where the CPU has them",
    ORACLE_WHEEL: "path to a local copy of the pinned torch-npu 2.13.0 wheel (else fetched "
                  "into `~/.cache/vllm_ascend_ext` on first use)",
}


def table_rows() -> list[str]:
    """README's environment-variable table, row by row."""
    return [f"| `{name}` | {meaning} |" for name, meaning in DOCUMENTED.items()]
