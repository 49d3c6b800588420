"""torch_npu's operator schemas (from the oracle's yaml) and argument binding against them.

``bind`` does what the dispatcher does with a call before any kernel runs: positional
then keyword arguments against the schema, every required argument present, no
unknown keyword, each value of the schema's type. It reports every problem as a
violation instead of raising the first.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from vllm_ascend_ext.contract import oracle

_MISSING = object()
# The yaml's sections that declare torch_npu's own operators.
SECTIONS = ("custom", "quant", "autograd", "symint")


@dataclass(frozen=True)
class Param:
    name: str
    type: str                 # the schema's type, e.g. "Tensor?", "SymInt[]?", "int"
    has_default: bool
    default: Any
    kwarg_only: bool
    mutable: bool             # Tensor(a!)


@dataclass(frozen=True)
class Schema:
    name: str                 # "npu_fused_infer_attention_score" (overload "" = default)
    overload: str
    text: str                 # the yaml's func line
    params: tuple[Param, ...]


@dataclass
class Bound:
    schema: Schema
    values: dict[str, Any] = field(default_factory=dict)   # every parameter, defaults filled
    problems: list[tuple[str, str]] = field(default_factory=list)  # (argument, what is wrong)


@functools.cache
def all_schemas() -> dict[str, Schema]:
    """``name[.overload]`` -> Schema, for every ``func:`` of the pinned yaml (first wins)."""
    import yaml

    doc = yaml.safe_load(oracle.load()[oracle.SCHEMAS])
    out: dict[str, Schema] = {}
    for section in SECTIONS:  # "supported" lists ATen operators the backend implements
        for entry in doc.get(section) or ():
            text = entry.get("func") if isinstance(entry, dict) else None
            if text and "(" in text:
                schema = parse(text)
                out.setdefault(_key(schema.name, schema.overload), schema)
    return out


def schema(name: str, overload: str = "") -> Schema:
    try:
        return all_schemas()[_key(name, overload)]
    except KeyError:
        raise KeyError(f"torch_npu {VERSION_NOTE}: no schema for {_key(name, overload)!r}") from None


VERSION_NOTE = f"{oracle.VERSION} (npu_native_functions_by_codegen.yaml)"


def _key(name: str, overload: str) -> str:
    return f"{name}.{overload}" if overload else name


def parse(text: str) -> Schema:
    fs = torch._C.parse_schema(text)
    params = tuple(
        Param(a.name, str(a.real_type), a.has_default_value(), a.default_value, a.kwarg_only,
              a.alias_info is not None and a.alias_info.is_write)
        for a in fs.arguments)
    return Schema(fs.name, fs.overload_name, text, params)


def bind(schema: Schema, args: Sequence[Any], kwargs: dict[str, Any]) -> Bound:
    bound = Bound(schema)
    positional = [p for p in schema.params if not p.kwarg_only]
    if len(args) > len(positional):
        bound.problems.append(("*args", f"{len(args)} positional arguments given, the schema "
                               f"takes {len(positional)}: {schema.text}"))
    names = {p.name for p in schema.params}
    for key in kwargs:
        if key not in names:
            bound.problems.append((key, f"unknown keyword argument; the schema is {schema.text}"))
    for i, p in enumerate(schema.params):
        value = _MISSING
        if not p.kwarg_only and i < len(args):
            value = args[i]
            if p.name in kwargs:
                bound.problems.append((p.name, "given both positionally and as a keyword"))
        elif p.name in kwargs:
            value = kwargs[p.name]
        if value is _MISSING:
            if not p.has_default:
                bound.problems.append((p.name, f"required argument missing ({p.type})"))
                continue
            value = p.default
        problem = type_problem(p.type, value)
        if problem:
            bound.problems.append((p.name, problem))
        bound.values[p.name] = value
    return bound


def type_problem(type_str: str, value: Any) -> str | None:
    """Why ``value`` is not of the schema type (None if it is). ``type_str`` is the
    parsed form: ``Tensor``, ``Optional[Tensor]``, ``List[int]`` (``SymInt[]``), ..."""
    if type_str.startswith("Optional[") and type_str.endswith("]"):
        return None if value is None else type_problem(type_str[9:-1], value)
    if type_str.startswith("List[") and type_str.endswith("]"):
        inner = type_str[5:-1]
        if isinstance(value, torch.Tensor) or not isinstance(value, (list, tuple)):
            return f"expected a list of {inner} ({type_str}), got {_describe(value)}"
        for item in value:
            problem = type_problem(inner, item)
            if problem:
                return f"element: {problem}"
        return None
    checks = {
        "Tensor": lambda v: isinstance(v, torch.Tensor),
        # As the dispatcher's Python binding (toIValue): an int may also be given as a
        # dtype, layout or memory format, converted to its enum value.
        "int": lambda v: (isinstance(v, (int, torch.SymInt, torch.dtype, torch.layout,
                                         torch.memory_format)) and not isinstance(v, bool)),
        "SymInt": lambda v: isinstance(v, (int, torch.SymInt)) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "bool": lambda v: isinstance(v, bool),
        "str": lambda v: isinstance(v, str),
        "ScalarType": lambda v: isinstance(v, torch.dtype),
        "number": lambda v: isinstance(v, (int, float, bool)),
        "Scalar": lambda v: isinstance(v, (int, float, bool)),
        "Device": lambda v: isinstance(v, (str, torch.device)),
        "Layout": lambda v: isinstance(v, torch.layout),
    }
    check = checks.get(type_str)
    if check is None or check(value):
        return None
    return f"expected {type_str}, got {_describe(value)}"


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a Tensor {tuple(value.shape)} {value.dtype}"
    return f"{value!r} ({type(value).__name__})"
