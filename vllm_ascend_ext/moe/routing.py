"""Which torch_npu gating operator routes a MoE layer, with which arguments (pure).

vLLM's routers compute, for ``scores = softmax|sigmoid(router_logits)`` (float32):
experts *selected* on ``scores + e_score_correction_bias`` (bias for selection only),
optionally within the ``topk_group`` best of ``num_expert_group`` groups (grouped
top-k: DeepSeek-V3/V3.2, GLM-5); weights are the unbiased scores of the chosen
experts, divided by their sum when ``renormalize``, times ``routed_scaling_factor``.
Plain softmax top-k (Qwen MoE, Qwen3-Next/Qwen3.5) has neither bias nor groups, and vLLM
applies no scaling factor to it.

On the NPU that is one operator:

- ``GATING``: ``npu_moe_gating_top_k`` (groups, bias, scaling and, in sigmoid mode, the
  renormalisation in the kernel). Two combinations the kernel does not produce are
  finished by the plugin: sigmoid without renormalisation (weights gathered from the
  kernel's ``norm_out``) and softmax with renormalisation (a division after the kernel).
- ``SOFTMAX``: ``npu_moe_gating_top_k_softmax``, plus the renormalising division when
  asked (vllm-ascend's route for Qwen MoE).

Anything else vLLM's layer may ask for (custom routing functions, hash routing, other
scoring functions, router weights applied to the input, expert biases, activations other
than SiLU-gated) is refused when the layer is built, naming the feature.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_ascend_ext.errors import AscendExtError

GATING, SOFTMAX = "gating_top_k", "gating_top_k_softmax"
MAX_EXPERTS = 1024   # npu_grouped_matmul's group list (npu_moe_gating_top_k allows 2048)
SCORING = {"softmax": 0, "sigmoid": 1}   # npu_moe_gating_top_k's norm_type


class UnsupportedMoEError(AscendExtError):
    """A MoE layer asks for something the plugin's MoE method does not compute."""


@dataclass(frozen=True)
class RoutingPlan:
    op: str                       # GATING or SOFTMAX
    top_k: int
    num_experts: int
    norm_type: int = 0            # 0 softmax, 1 sigmoid
    group_count: int = 1
    k_group: int = 1
    group_select_mode: int = 0    # 0 group max, 1 sum of the group's two best
    use_bias: bool = False
    renormalize: bool = False
    scaling: float = 1.0

    @property
    def kernel_renormalizes(self) -> bool:
        """The kernel's own weights already match: sigmoid renormalises, softmax does not."""
        return self.op == GATING and self.renormalize == (self.norm_type == 1)

    @property
    def kernel_scales(self) -> bool:
        return self.op == GATING and self.kernel_renormalizes

    def describe(self) -> str:
        if self.op == SOFTMAX:
            return f"softmax top-{self.top_k}{' renormalized' if self.renormalize else ''}"
        scoring = "sigmoid" if self.norm_type else "softmax"
        groups = (f", top {self.k_group} of {self.group_count} groups ("
                  f"{'top-2 sum' if self.group_select_mode else 'max'})" if self.group_count > 1 else "")
        return (f"{scoring} top-{self.top_k}{' + bias' if self.use_bias else ''}{groups}"
                f"{', renormalized' if self.renormalize else ''}"
                f"{f', x{self.scaling:g}' if self.scaling != 1.0 else ''}")


def _refuse(layer_name: str, feature: str) -> UnsupportedMoEError:
    return UnsupportedMoEError(
        f"{layer_name}: the ascend_ext MoE method does not support {feature}; the plugin "
        "computes softmax/sigmoid top-k routing (optionally grouped, with a selection bias) "
        "and SiLU-gated experts")


def plan_routing(*, layer_name: str, top_k: int, num_experts: int, scoring_func: str,
                 renormalize: bool, use_grouped_topk: bool, num_expert_group: int | None,
                 topk_group: int | None, has_bias: bool, routed_scaling_factor: float,
                 custom_routing_function: object = None) -> RoutingPlan:
    if custom_routing_function is not None:
        raise _refuse(layer_name, f"a custom routing function "
                      f"({getattr(custom_routing_function, '__name__', custom_routing_function)})")
    if scoring_func not in SCORING:
        raise _refuse(layer_name, f"scoring_func={scoring_func!r}")
    if num_experts > MAX_EXPERTS:
        raise _refuse(layer_name, f"{num_experts} experts (npu_grouped_matmul takes at most "
                      f"{MAX_EXPERTS} groups)")
    groups, kept = 1, 1
    if use_grouped_topk and num_expert_group and num_expert_group > 1:
        if num_experts % num_expert_group or num_experts <= num_expert_group:
            # vLLM then routes without groups, differently per router (its CPU router fails).
            raise _refuse(layer_name, f"{num_experts} experts in {num_expert_group} groups "
                          "(not an even split)")
        if not topk_group:
            raise _refuse(layer_name, "grouped top-k without topk_group")
        groups, kept = num_expert_group, topk_group
    grouped_or_biased = groups > 1 or has_bias or use_grouped_topk
    if not grouped_or_biased and scoring_func == "softmax":
        if not 1 <= top_k <= min(num_experts, 1024):
            raise _refuse(layer_name, f"top_k={top_k} of {num_experts} experts")
        return RoutingPlan(SOFTMAX, top_k, num_experts, renormalize=renormalize)
    size = num_experts // groups
    if size <= 2 or (size + 31) // 32 * 32 * groups > 2048:
        raise _refuse(layer_name, f"{num_experts} experts in {groups} group(s): "
                      "npu_moe_gating_top_k needs more than 2 experts per group and "
                      "align32(group size) x groups <= 2048")
    if not 1 <= top_k <= size * kept:
        raise _refuse(layer_name, f"top_k={top_k} with {kept} of {groups} groups of {size} experts")
    return RoutingPlan(GATING, top_k, num_experts, norm_type=SCORING[scoring_func],
                       group_count=groups, k_group=kept,
                       group_select_mode=1 if has_bias else 0, use_bias=has_bias,
                       renormalize=renormalize,
                       scaling=routed_scaling_factor if grouped_or_biased else 1.0)
