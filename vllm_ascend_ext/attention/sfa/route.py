"""Which preprocessing an SFA layer takes: native chain or the fused MLA prolog (pure).

The rule (vllm-ascend PR 16328, the route vllm-ascend takes for DeepSeek-V3.2):

- a prefill context-parallel route, when enabled, excludes the fused prolog;
- quantized layers (W8A8 dynamic; MXFP8 where the SoC has it) take
  ``npu_mla_prolog_v3`` in every deployment (plain serving, KV producer, KV
  consumer) and every attention state (the route is per layer, not per step);
- unquantized layers keep the native chain, except on KV consumers;
- KV-cache quantization (C8) only chooses the cache layout, never the route;
- the fallback (native-chain) weights are disposed wherever the layer takes the fused
  prolog: its forward never runs the native chain (vllm-ascend disposes them on KV
  consumers only; keeping them elsewhere holds an ND copy beside each NZ prolog weight);
- ``sfa.preprocess``: ``auto`` applies the rule, ``native`` forces the chain,
  ``prolog_v3`` forces the prolog and fails with a clear error where the layer
  cannot take it.

Which fused prolog operator a layer takes (``prolog_op``): layers with RoPE dims
(ordinary MLA and SFA, including the C8 per-tile KV mode) use torch_npu's
``npu_mla_prolog_v3``; layers without RoPE dims (``qk_rope_head_dim == 0``) use the
plugin's own ``_C_ascend_ext.npu_mla_prolog_v3_k3`` (``csrc/``), which has no KV-cache
quantization mode.

``decide`` takes plain values and returns the route with its reason; the model,
the log line and the tests call the same function.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_ascend_ext.errors import AscendExtError

QUANT_KINDS = ("float", "w8a8_dynamic", "mxfp8", "mixed")
KV_ROLES = ("none", "kv_producer", "kv_consumer", "kv_both")
KV_CACHE_QUANTS = ("none", "c8")
# SoC families whose MLA prolog takes fp8 / mxfp8 weights (A2/A3 reject them).
MXFP8_FAMILIES = ("A5",)
PROLOG_V3 = "torch_npu.npu_mla_prolog_v3"
PROLOG_V3_K3 = "_C_ascend_ext.npu_mla_prolog_v3_k3"


class SfaRouteError(AscendExtError):
    """``sfa.preprocess`` asks for something the layer cannot take."""


@dataclass(frozen=True)
class LayerFacts:
    quant: str                 # one of QUANT_KINDS ("mixed": some prolog weights quantized)
    kv_role: str = "none"      # one of KV_ROLES
    prefill_cp: bool = False   # prefill context parallelism enabled
    kv_cache_quant: str = "none"
    soc_family: str = "A3"
    rope_dim: int = 64         # qk_rope_head_dim (0: a no-RoPE MLA layer)


@dataclass(frozen=True)
class Route:
    preprocess: str            # "native" | "prolog_v3"
    reason: str
    cache_layout: str          # "model-dtype latent+rope" | "int8 C8 latent+rope"
    dispose_fallback: bool     # free the native-chain weights after load
    prolog_op: str | None = None   # the fused operator, when preprocess == "prolog_v3"
    prolog_op_reason: str = ""


def prolog_op(rope_dim: int, kv_cache_quant: str = "none", quant: str = "float") -> tuple[str | None, str]:
    """(operator, reason) for a layer's fused prolog; operator None when none fits."""
    if rope_dim < 0:
        raise ValueError(f"SFA route: rope_dim={rope_dim} must be >= 0")
    if rope_dim > 0:
        mode = " (C8 per-tile KV mode)" if kv_cache_quant == "c8" else ""
        return PROLOG_V3, f"RoPE dims ({rope_dim}): torch_npu's npu_mla_prolog_v3{mode}"
    if kv_cache_quant == "c8":
        return None, "no-RoPE prolog (npu_mla_prolog_v3_k3) has no C8 KV-cache mode"
    if quant != "float":
        return None, f"no-RoPE prolog (npu_mla_prolog_v3_k3) takes bf16/fp32 weights, not {quant}"
    return PROLOG_V3_K3, "no RoPE dims (qk_rope_head_dim=0): the plugin's npu_mla_prolog_v3_k3"


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
    op, why = prolog_op(f.rope_dim, f.kv_cache_quant, f.quant)
    if op is None:
        return False, why
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
    op, op_reason = prolog_op(f.rope_dim, f.kv_cache_quant, f.quant) if route == "prolog_v3" \
        else (None, "")
    return Route(route, reason, layout, route == "prolog_v3", op, op_reason)
