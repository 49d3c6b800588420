"""Reading ModelSlim's ``quant_model_description.json`` (pure, no vLLM).

Ascend checkpoints quantized by ModelSlim carry one JSON object: per-tensor types
(``"model.layers.0.self_attn.q_a_proj.weight": "W8A8_DYNAMIC"``, ``"...": "FLOAT"``)
plus ``"model_quant_type"`` and a few metadata keys (``"version"``, ...).

What this plugin serves: ``FLOAT`` and ``W8A8_DYNAMIC`` linear layers (attention
projections, dense MLP, shared experts, the indexer's ``wq_b``) and routed experts, a MoE
layer's experts all of one type (their gate/up/down projections included). Any other
type, or a MoE layer whose experts mix types, is rejected at startup with an error naming
the tensors and the types.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from vllm_ascend_ext.errors import AscendExtError

FILENAME = "quant_model_description.json"

FLOAT = "FLOAT"
W8A8_DYNAMIC = "W8A8_DYNAMIC"
SUPPORTED_TYPES = (FLOAT, W8A8_DYNAMIC)
# Keys that describe the file, not a tensor.
METADATA_KEYS = ("model_quant_type", "version", "group_size", "kv_quant_type",
                 "fa_quant_type", "reduce_quant_type", "metadata")
_ROUTED_EXPERT = re.compile(r"^(?P<layer>.*\.experts)\.(?P<expert>\d+)\.(?P<proj>\w+)\.weight$")


class QuantDescriptionError(AscendExtError):
    """The description asks for something the plugin cannot serve; names the tensor."""


@dataclass(frozen=True)
class QuantDescription:
    model_quant_type: str
    types: Mapping[str, str]          # tensor name -> type
    # MoE layer ("...mlp.experts") -> the type of its experts
    experts: Mapping[str, str] = field(default_factory=dict)

    def weight_type(self, prefix: str) -> str:
        """Type of ``<prefix>.weight``; tensors the file does not list are FLOAT."""
        return self.types.get(f"{prefix}.weight", FLOAT)

    def layer_type(self, prefix: str, shards: tuple[str, ...] = ()) -> str:
        """Type of a (possibly packed) layer; every shard must agree."""
        if not shards:
            return self.weight_type(prefix)
        parent = prefix.rsplit(".", 1)[0]
        found = {s: self.weight_type(f"{parent}.{s}") for s in shards}
        kinds = set(found.values())
        if len(kinds) > 1:
            raise QuantDescriptionError(
                f"{FILENAME}: the shards of {prefix} have different types {found}; "
                "a packed layer needs one type"
            )
        return kinds.pop()

    def experts_type(self, prefix: str) -> str:
        """Type of the routed experts of the MoE layer ``prefix`` (``...mlp.experts``):
        FLOAT when the file lists none of them (``parse`` has checked they agree)."""
        return self.experts.get(prefix, FLOAT)


def parse(raw: Mapping[str, object]) -> QuantDescription:
    if not isinstance(raw, Mapping):
        raise QuantDescriptionError(f"{FILENAME}: expected a JSON object, got {type(raw).__name__}")
    types: dict[str, str] = {}
    experts: dict[str, dict[str, str]] = {}    # MoE layer -> {expert weight: type}
    for name, value in raw.items():
        if name in METADATA_KEYS:
            continue
        if not isinstance(value, str):
            raise QuantDescriptionError(
                f"{FILENAME}: {name!r} has type {value!r}; expected a string such as 'FLOAT'"
            )
        if value not in SUPPORTED_TYPES:
            raise QuantDescriptionError(
                f"{FILENAME}: {name!r} is {value!r}, which ascend_ext does not serve "
                f"(supported: {', '.join(SUPPORTED_TYPES)})"
            )
        match = _ROUTED_EXPERT.match(name)
        if match:
            experts.setdefault(match.group("layer"), {})[name] = value
        types[name] = value
    layer_types: dict[str, str] = {}
    for layer, found in experts.items():
        kinds = sorted(set(found.values()))
        if len(kinds) > 1:
            first: dict[str, str] = {}
            for name, kind in found.items():
                first.setdefault(kind, name)
            shown = ", ".join(f"{name}: {kind}" for kind, name in first.items())
            raise QuantDescriptionError(
                f"{FILENAME}: the routed experts of {layer} mix types ({shown}); a MoE "
                "layer's experts must all be FLOAT or all W8A8_DYNAMIC"
            )
        layer_types[layer] = kinds[0]
    mqt = raw.get("model_quant_type", W8A8_DYNAMIC)
    if not isinstance(mqt, str):
        raise QuantDescriptionError(f"{FILENAME}: model_quant_type must be a string, got {mqt!r}")
    return QuantDescription(model_quant_type=mqt, types=types, experts=layer_types)
