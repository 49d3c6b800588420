"""The plugin's environment variables (prefix ``ASCEND_EXT_``, not ``VLLM_``).

vLLM warns about unknown ``VLLM_*`` variables, so the plugin uses its own prefix.
Each is read when asked for, never cached at import.
"""

from __future__ import annotations

import os

EMULATE = "ASCEND_EXT_EMULATE"
SOC = "ASCEND_EXT_SOC"

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def emulate_requested() -> bool:
    """True when ``ASCEND_EXT_EMULATE`` asks for the emulated (CPU) platform."""
    raw = os.environ.get(EMULATE, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ValueError(
        f"{EMULATE}={os.environ[EMULATE]!r}: expected one of "
        f"{', '.join(_TRUE + _FALSE[1:])}"
    )


def emulated_soc_name() -> str | None:
    """The SoC to emulate (``ASCEND_EXT_SOC``), or None for the default."""
    raw = os.environ.get(SOC, "").strip()
    return raw or None
