"""The plugin's typed configuration: parsing, validation and the one accessor.

Users pass ``--additional-config '{"ascend_ext": {...}}'`` (or
``LLM(additional_config={"ascend_ext": {...}})``). Only the ``"ascend_ext"``
section belongs to this plugin; every other key of ``additional_config`` is
vLLM's or another plugin's and is left alone.

The section is parsed once into a frozen :class:`AscendExtConfig`. Nothing else in
the plugin reads the raw dict: code asks :func:`get_config` for the object.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, fields
from typing import Any

from vllm_ascend_ext.errors import AscendExtError

SECTION = "ascend_ext"

MIXED_SPLIT_CHOICES = ("auto", "on", "off")
SFA_PREPROCESS_CHOICES = ("auto", "native", "prolog_v3")
WEIGHT_NZ_CHOICES = ("auto", "off")
LAYER_OPS_CHOICES = ("fused", "native")
MOE_DISPATCH_CHOICES = ("auto", "allgather", "mc2", "alltoall")


class AscendExtConfigError(AscendExtError):
    """A bad ``additional_config["ascend_ext"]`` value; the message names the key."""


@dataclass(frozen=True)
class SfaConfig:
    """``ascend_ext.sfa``: DeepSeek-V3.2 / GLM-5 sparse attention knobs."""

    # "auto": quantized layers take npu_mla_prolog_v3, others the native chain.
    preprocess: str = "auto"


@dataclass(frozen=True)
class AscendExtConfig:
    """Everything the plugin can be told, after validation."""

    # Mixed chunked-prefill steps: "auto" lets the gate decide, "on"/"off" force it.
    mixed_split: str = "auto"
    sfa: SfaConfig = field(default_factory=SfaConfig)
    # Quantized (int8) matmul weights in FRACTAL_NZ: "auto" where the docs give it (A2/A3).
    weight_nz: str = "auto"
    # RMSNorm / RoPE / SiluAndMul: torch_npu's fused operators, or vLLM's native PyTorch.
    layer_ops: str = "fused"
    # Expert-parallel token exchange under DP: "auto" takes MC2 where its documented
    # bounds hold (moe/mc2.py), for the steps within its tokens per rank, and the
    # all-gather / reduce-scatter otherwise; "allgather" always the all-gather; "mc2"
    # refuses at model load where MC2 cannot run; "alltoall" (opt-in: one host read per MoE
    # layer per step) sends each row only to its expert's rank (moe/alltoall.py) in the
    # eager steps MC2 does not take (graph steps: MC2 or all-gather; moe/step_route.py).
    moe_dispatch: str = "auto"


# One schema drives parsing, errors and the README table (tests/ut/suite/test_readme_ci.py): key -> (type, choices, doc).
_SCHEMA: dict[str, dict[str, tuple[type, tuple[str, ...] | None, str]]] = {
    "": {
        "mixed_split": (str, MIXED_SPLIT_CHOICES, "split mixed prefill/decode steps"),
        "sfa": (dict, None, "sparse-attention (SFA) section"),
        "weight_nz": (str, WEIGHT_NZ_CHOICES,
                      "int8 weights in FRACTAL_NZ (auto: on A2/A3; off: keep ND)"),
        "layer_ops": (str, LAYER_OPS_CHOICES,
                      "RMSNorm, RoPE, SiluAndMul: fused torch_npu ops, or vLLM's native"),
        "moe_dispatch": (str, MOE_DISPATCH_CHOICES,
                         "expert-parallel token exchange under DP (auto: MC2 for decode-sized steps where documented, else all-gather; alltoall: opt-in, one host read per MoE layer and step, for the eager steps MC2 does not take); under TP + EP without DP, mc2 / alltoall split the tokens over the TP ranks (auto: the TP all-reduce)"),
    },
    "sfa": {
        "preprocess": (str, SFA_PREPROCESS_CHOICES, "SFA preprocessing route"),
    },
}


def _type_name(value: Any) -> str:
    return type(value).__name__


def _check_keys(raw: dict, section: str, path: str) -> None:
    allowed = _SCHEMA[section]
    for key in raw:
        if not isinstance(key, str):
            raise AscendExtConfigError(
                f"{path}: keys must be strings, got {key!r} ({_type_name(key)})"
            )
        if key not in allowed:
            close = difflib.get_close_matches(key, list(allowed), n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise AscendExtConfigError(
                f"{path}: unknown key {key!r}{hint} "
                f"(allowed keys: {', '.join(sorted(allowed))})"
            )


def _check_choice(value: Any, section: str, key: str, path: str) -> str:
    expected, choices, _ = _SCHEMA[section][key]
    # bool is an int subclass and "false" is a truthy string: accept exact types only.
    if type(value) is not expected:
        raise AscendExtConfigError(
            f"{path}.{key}: expected a {expected.__name__} "
            f"(one of {', '.join(repr(c) for c in choices or ())}), "
            f"got {value!r} ({_type_name(value)})"
        )
    if choices is not None and value not in choices:
        close = difflib.get_close_matches(value, list(choices), n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise AscendExtConfigError(
            f"{path}.{key}: invalid value {value!r}{hint} "
            f"(allowed: {', '.join(repr(c) for c in choices)})"
        )
    return value


def _parse_sfa(raw: Any, path: str) -> SfaConfig:
    if not isinstance(raw, dict):
        raise AscendExtConfigError(
            f"{path}: expected an object (dict), got {raw!r} ({_type_name(raw)})"
        )
    _check_keys(raw, "sfa", path)
    kwargs = {k: _check_choice(v, "sfa", k, path) for k, v in raw.items()}
    return SfaConfig(**kwargs)


def parse_config(additional_config: Any) -> AscendExtConfig:
    """Parse vLLM's ``additional_config`` into an :class:`AscendExtConfig`.

    Raises :class:`AscendExtConfigError` naming the offending key, the value and
    what is allowed. A missing or ``None`` ``additional_config`` means defaults.
    """
    if additional_config is None:
        return AscendExtConfig()
    if not isinstance(additional_config, dict):
        raise AscendExtConfigError(
            "additional_config: expected an object (dict), got "
            f"{additional_config!r} ({_type_name(additional_config)})"
        )
    raw = additional_config.get(SECTION)
    if raw is None:
        return AscendExtConfig()
    if not isinstance(raw, dict):
        raise AscendExtConfigError(
            f"{SECTION}: expected an object (dict), got {raw!r} ({_type_name(raw)})"
        )
    _check_keys(raw, "", SECTION)
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "sfa":
            kwargs["sfa"] = _parse_sfa(value, f"{SECTION}.sfa")
        else:
            kwargs[key] = _check_choice(value, "", key, SECTION)
    return AscendExtConfig(**kwargs)


def to_dict(config: AscendExtConfig) -> dict[str, Any]:
    """The ``"ascend_ext"`` section that parses back to ``config``."""
    out: dict[str, Any] = {}
    for f in fields(config):
        value = getattr(config, f.name)
        if isinstance(value, SfaConfig):
            value = {g.name: getattr(value, g.name) for g in fields(value)}
        out[f.name] = value
    return out


def schema_rows() -> list[tuple[str, str, str]]:
    """(key, allowed values, meaning) rows, for docs and ``--help`` output."""
    rows = []
    for section, keys in _SCHEMA.items():
        for key, (_, choices, doc) in keys.items():
            if choices is None:
                continue
            name = f"{SECTION}.{section + '.' if section else ''}{key}"
            rows.append((name, " | ".join(choices), doc))
    return rows


def get_config(vllm_config: Any = None) -> AscendExtConfig:
    """The one accessor: the plugin config of ``vllm_config`` (or the current one).

    Parsing is pure and cheap (a handful of dict lookups); callers that need it
    per step should read it once in their ``__init__``.
    """
    if vllm_config is None:
        from vllm.config import get_current_vllm_config

        vllm_config = get_current_vllm_config()
    return parse_config(getattr(vllm_config, "additional_config", None))
