"""Which preprocessing an SFA layer takes: native chain or the fused MLA prolog (pure).

The rule (vllm-ascend PR 16328, ``shared/prior-art.md``):

- a prefill context-parallel route, when enabled, excludes the fused prolog;
- quantized layers (W8A8 dynamic; MXFP8 where the SoC has it) take
  ``npu_mla_prolog_v3`` in every deployment (plain serving, KV producer, KV
  consumer) and every attention state (the route is per layer, not per step);
- unquantized layers keep the native chain, except on KV consumers;
- KV-cache quantization (C8) only chooses the cache layout, never the route;
- the fallback (native-chain) weights are disposed only on KV consumers;
- ``sfa.preprocess``: ``auto`` applies the rule, ``native`` forces the chain,
  ``prolog_v3`` forces the prolog and fails with a clear error where the layer
  cannot take it.

``decide`` takes plain values and returns the route with its reason; the model,
the log line and the tests call the same function.
"""

from __future__ import annotations

from dataclasses import dataclass

QUANT_KINDS = ("float", "w8a8_dynamic", "mxfp8", "mixed")
KV_ROLES = ("none", "kv_producer", "kv_consumer", "kv_both")
KV_CACHE_QUANTS = ("none", "c8")
# SoC families whose MLA prolog takes fp8 / mxfp8 weights (A2/A3 reject them).
MXFP8_FAMILIES = ("A5",)


class SfaRouteError(ValueError):
    """``sfa.preprocess`` asks for something the layer cannot take."""


@dataclass(frozen=True)
class LayerFacts:
    quant: str                 # one of QUANT_KINDS ("mixed": some prolog weights quantized)
    kv_role: str = "none"      # one of KV_ROLES
    prefill_cp: bool = False   # prefill context parallelism enabled
    kv_cache_quant: str = "none"
    soc_family: str = "A3"


@dataclass(frozen=True)
class Route:
    preprocess: str            # "native" | "prolog_v3"
    reason: str
    cache_layout: str          # "model-dtype latent+rope" | "int8 C8 latent+rope"
    dispose_fallback: bool     # free the native-chain weights after load


def _check(f: LayerFacts, override: str) -> None:
    for name, value, allowed in (("quant", f.quant, QUANT_KINDS), ("kv_role", f.kv_role, KV_ROLES),
                                 ("kv_cache_quant", f.kv_cache_quant, KV_CACHE_QUANTS),
                                 ("sfa.preprocess", override, ("auto", "native", "prolog_v3"))):
        if value not in allowed:
            raise ValueError(f"SFA route: {name}={value!r} not in {allowed}")


def _fused_possible(f: LayerFacts) -> tuple[bool, str]:
    if f.prefill_cp:
        return False, "prefill context parallelism excludes the fused prolog"
    if f.quant == "mixed":
        return False, ("only part of the prolog weights (q_a_proj, q_b_proj, "
                       "kv_a_proj_with_mqa) are quantized")
    if f.quant == "mxfp8" and f.soc_family not in MXFP8_FAMILIES:
        return False, f"MXFP8 prolog weights need {'/'.join(MXFP8_FAMILIES)}, soc is {f.soc_family}"
    return True, ""


def decide(f: LayerFacts, override: str = "auto") -> Route:
    _check(f, override)
    layout = "int8 C8 latent+rope" if f.kv_cache_quant == "c8" else "model-dtype latent+rope"
    possible, why_not = _fused_possible(f)
    if override == "prolog_v3" and not possible:
        raise SfaRouteError(
            f"ascend_ext.sfa.preprocess='prolog_v3' cannot be used: {why_not}; "
            "use 'auto' or 'native'"
        )
    if override == "native":
        return Route("native", "forced by sfa.preprocess='native'", layout, False)
    if not possible:
        return Route("native", why_not, layout, False)
    if override == "prolog_v3":
        route, reason = "prolog_v3", "forced by sfa.preprocess='prolog_v3'"
    elif f.quant in ("w8a8_dynamic", "mxfp8"):
        route = "prolog_v3"
        reason = f"quantized layer ({f.quant}): fused prolog in every deployment and state"
    elif f.kv_role == "kv_consumer":
        route, reason = "prolog_v3", "unquantized layer on a KV consumer (decode only)"
    else:
        route = "native"
        reason = f"unquantized layer, deployment {f.kv_role!r}: native chain"
    return Route(route, reason, layout, route == "prolog_v3" and f.kv_role == "kv_consumer")
