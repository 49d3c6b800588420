"""Ascend SoC identities: torch_npu's ``get_soc_version()`` numbers and names.

One table, used by the real platform (from ``npu-smi``'s chip name or ``ASCEND_EXT_SOC``),
the emulated one (from ``ASCEND_EXT_SOC``), and every gate that depends on the chip. Numbers from
torch_npu's ``c10_npu::SocVersion`` (see ``docs/npu-ops.md`` section 6).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from vllm_ascend_ext.errors import AscendExtError


class UnknownSocError(AscendExtError):
    """A SoC name or version this table does not know (or a family the plugin refuses)."""


@dataclass(frozen=True)
class Soc:
    name: str  # canonical lower-case name, e.g. "ascend910b2", "ascend950"
    family: str  # "A2", "A3", "A5" (Ascend 950), "310P"
    version: int  # torch_npu get_soc_version() value


_SOCS: tuple[Soc, ...] = (
    Soc("ascend910b1", "A2", 220),
    Soc("ascend910b2", "A2", 221),
    Soc("ascend910b2c", "A2", 222),
    Soc("ascend910b3", "A2", 223),
    Soc("ascend910b4", "A2", 224),
    Soc("ascend910b4_1", "A2", 225),
    Soc("ascend910_9391", "A3", 250),
    Soc("ascend910_9392", "A3", 251),
    Soc("ascend910_9381", "A3", 252),
    Soc("ascend910_9382", "A3", 253),
    Soc("ascend910_9372", "A3", 254),
    Soc("ascend910_9362", "A3", 255),
    Soc("ascend950", "A5", 260),
    Soc("ascend310p1", "310P", 200),
    Soc("ascend310p3", "310P", 202),
)

# Short names users type; each maps to one representative chip.
_ALIASES = {
    "a2": "ascend910b2",
    "910b": "ascend910b2",
    "atlas800a2": "ascend910b2",
    "a3": "ascend910_9391",
    "atlas800a3": "ascend910_9391",
    "a5": "ascend950",
    "950": "ascend950",
}

# What the emulated platform pretends to be when ASCEND_EXT_SOC is unset.
DEFAULT_EMULATED_SOC = "ascend910b2"

# Families whose chips this plugin targets (others are refused at startup).
SUPPORTED_FAMILIES = ("A2", "A3", "A5")


def known() -> tuple[Soc, ...]:
    """Every chip of the table (served or not)."""
    return _SOCS


def aliases() -> dict[str, str]:
    """Short names users type -> canonical chip name."""
    return dict(_ALIASES)


def names() -> list[str]:
    return [s.name for s in _SOCS] + sorted(_ALIASES)


def _squash(name: str) -> str:
    """Lower case without separators: ``Ascend910B4-1``, ``ascend910b4_1`` and ``910B4 1``
    are one chip (npu-smi prints ``910B4-1``; torch_npu names it ``Ascend910B4_1``)."""
    return "".join(c for c in name.lower() if c not in "_-" and not c.isspace())


_BY_SQUASHED_NAME = {_squash(soc.name): soc for soc in _SOCS}


def from_name(name: str) -> Soc:
    key = _squash(name)
    bare = key.removeprefix("ascend")
    key = _squash(_ALIASES.get(key, _ALIASES.get(bare, key)))
    soc = _BY_SQUASHED_NAME.get(key) or _BY_SQUASHED_NAME.get("ascend" + key)
    if soc is not None:
        return soc
    close = difflib.get_close_matches(key, names(), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise UnknownSocError(
        f"unknown Ascend SoC {name!r}; {hint}known: {', '.join(names())}"
    )


def require_supported(soc: Soc) -> Soc:
    """``soc`` if the plugin serves its family, else a clear refusal."""
    if soc.family not in SUPPORTED_FAMILIES:
        raise UnknownSocError(
            f"SoC {soc.name} ({soc.family}) is not supported by this plugin "
            f"(supported families: {', '.join(SUPPORTED_FAMILIES)}: "
            f"{', '.join(s.name for s in _SOCS if s.family in SUPPORTED_FAMILIES)})"
        )
    return soc


def from_version(version: int) -> Soc:
    for soc in _SOCS:
        if soc.version == version:
            return soc
    if 220 <= version <= 225:
        return Soc(f"soc{version}", "A2", version)
    if 250 <= version <= 255:
        return Soc(f"soc{version}", "A3", version)
    if version >= 260:
        return Soc(f"soc{version}", "A5", version)
    raise UnknownSocError(
        f"unsupported Ascend SoC version {version} (this plugin supports "
        f"{', '.join(SUPPORTED_FAMILIES)}: versions 220-225, 250-255, >=260)"
    )

# Families where splitting a mixed step into a decode and a prefill FIA call pays:
# Ascend 950 (A5), measured by vllm-ascend PR 11948 and sglang PR 34387. The one place
# this list lives; A2/A3 are unmeasured, so "auto" keeps them on one call.
SPLIT_PAYS_FAMILIES = ("A5",)


def current_family() -> str | None:
    """The SoC family the current vLLM platform serves (``"A2"`` ...), None off the
    ascend_ext platforms (callers choose their default there)."""
    from vllm.platforms import current_platform

    soc = getattr(current_platform, "soc", None)
    return soc().family if soc is not None else None
