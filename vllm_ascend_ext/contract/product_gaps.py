"""Operators the plugin calls on a SoC family their torch_npu 2.13 documentation does not list.

Contract mode checks each call against the operator's supported products (支持的型号).
Where the only objection is that list, the gap is one the documentation implies, not a
contract the call breaks: the call is counted per SoC as a *documentation gap*, with the
route the plugin takes there, and reported in the summary and in docs/contract-mode.md's op-by-SoC table
(``python -m vllm_ascend_ext.contract.product_gaps`` prints it). A gap not in ``GAPS``
stays a violation, so a new operator or SoC never passes silently.
"""

from __future__ import annotations

from vllm_ascend_ext.contract import docs
from vllm_ascend_ext.ops.moe_distribute_bounds import FAMILIES as FAMILIES_MC2

FAMILIES = ("A2", "A3", "A5")
FAMILY_NAMES = {"A2": "Atlas A2", "A3": "Atlas A3", "A5": "Ascend 950"}

_SAME = ("called as on {listed}: the plugin has no other route; unverified on this SoC "
         "until it runs there")
_A3_IN_PRODUCTION = ("called as on A2, as vllm-ascend's MoE path does on every SoC it serves "
                     "(no SoC branch there, A3 among them); the 2.13 documentation lists "
                     "{listed} only")
# Written out: its 支持的型号 ("A2训练、推理系列产品", "A3训练、推理系列产品") reads as
# 310P/A2/A3 to docs.families (the 推理系列 after 、 is A2's inference series, not 310P).
_UNFUSED_THERE = ("not called there: the W8A8 experts take it only with FRACTAL_NZ weights "
                  "(A2/A3); elsewhere they run npu_dynamic_quant, npu_grouped_matmul and "
                  "npu_swiglu instead; the 2.13 documentation lists A2/A3 only")
_PROLOG_ON_A5 = ("called as on {listed}: the fused prolog is the SFA layers' default route "
                 "on every SoC (ascend_ext.sfa.preprocess: \"native\" takes the unfused chain "
                 "instead); unverified on this SoC until it runs there")
_W8A8_MLP_A2_A3 = ("not called there: the W8A8 MLPs take it on A2/A3 only (the SoCs "
                   "its documentation lists); elsewhere they run npu_quant_matmul with a "
                   "floating output, npu_swiglu and npu_dynamic_quant")

_SAMPLER_A2_A3 = ("not called there: the sampler filters top-k / top-p with vLLM's PyTorch "
                  "filter (worker/npu_sampler.py); the 2.13 documentation lists A2/A3 only")
# op -> {family the docs do not list: the route the plugin takes there}
GAPS: dict[str, dict[str, str]] = {
    "npu_fused_infer_attention_score": {"A5": _SAME},
    "npu_mla_prolog_v3": {"A5": _PROLOG_ON_A5},
    "npu_moe_gating_top_k_softmax": {"A3": _A3_IN_PRODUCTION, "A5": _SAME},
    "npu_grouped_matmul": {"A3": _A3_IN_PRODUCTION, "A5": _SAME},
    "npu_swiglu": {"A3": _A3_IN_PRODUCTION, "A5": _SAME},
    "npu_gemma_rms_norm": {"A5": _SAME},
    "npu_add_rms_norm_dynamic_quant": {"A5": _SAME},
    "npu_moe_init_routing_v2": {"A5": _SAME},
    "npu_scatter_pa_kv_cache": {"A5": _SAME},
    "npu_dynamic_quant": {"A5": _SAME},
    "npu_quant_matmul": {"A5": _SAME},
    "npu_chunk_gated_delta_rule": {"A5": _SAME},
    "npu_recurrent_gated_delta_rule": {"A5": _SAME},
    "npu_grouped_matmul_swiglu_quant": {"A5": _UNFUSED_THERE},
    "npu_dequant_swiglu_quant": {"A5": _W8A8_MLP_A2_A3},
    "npu_top_k_top_p": {"A5": _SAMPLER_A2_A3},
}


# Operators the 2.13 wheel documents nowhere, with the products their own pages list
# (ops/moe_distribute_bounds.py; checked by contract/mc2_rules.py) and the route elsewhere.
HAND_WRITTEN_PRODUCTS: dict[str, tuple[tuple[str, ...], str]] = {
    op: (FAMILIES_MC2, "not called there: the MC2 gate declines (vLLM's all-gather exchange)")
    for op in ("npu_moe_distribute_dispatch_v2", "npu_moe_distribute_combine_v2")
}


def route(op: str, family: str) -> str | None:
    """The route the plugin takes for a documentation gap, None if it is not one."""
    text = GAPS.get(op, {}).get(family)
    if text is None:
        return None
    return text.format(listed="/".join(docs.families(op) or ()))


def doc_gaps(ops) -> dict[str, list[str]]:
    """For each of ``ops`` whose documentation lists products: the served families it
    does not list (what ``GAPS`` must cover)."""
    out = {}
    for op in sorted(ops):
        listed = docs.families(op)
        if listed is not None:
            missing = [f for f in FAMILIES if f not in listed]
            if missing:
                out[op] = missing
    return out


def markdown_table(ops) -> str:
    """docs/contract-mode.md's op-by-SoC table: documented (yes), unspecified (no product list), or the
    route the plugin takes on a family the documentation does not list."""
    head = ("| operator | " + " | ".join(FAMILY_NAMES[f] for f in FAMILIES) + " |\n"
            "|---|" + "---|" * len(FAMILIES) + "\n")
    rows = []
    for op in sorted(ops):
        listed = docs.families(op)
        cells = []
        hand = HAND_WRITTEN_PRODUCTS.get(op)
        for family in FAMILIES:
            if listed is None and hand is not None:
                cells.append("documented (op-plugin page)" if family in hand[0]
                             else f"not listed: {hand[1]}".replace("not listed: not called", "not listed; not called"))
            elif listed is None:
                cells.append("unspecified")
            elif family in listed:
                cells.append("documented")
            else:
                cells.append(f"gap: {route(op, family) or 'REFUSED (no route)'}")
        rows.append(f"| `{op}` | " + " | ".join(cells) + " |")
    return head + "\n".join(rows) + "\n"


def main() -> None:
    from vllm_ascend_ext.ops import registry

    print(markdown_table(registry.TORCH_NPU_OPS), end="")


if __name__ == "__main__":
    main()
