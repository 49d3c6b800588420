"""One MoE layer's routed experts as torch_npu operator calls (pure functions).

A step issues a fixed sequence per layer, whatever the number of experts and tokens:

1. routing: ``npu_moe_gating_top_k`` or ``npu_moe_gating_top_k_softmax`` (see
   ``routing.py``), plus at most two element-wise operations for the combinations the
   kernels do not produce;
2. ``npu_moe_init_routing_v2``: the (token, k) pairs sorted by expert, the tokens copied in
   that order, the per-expert counts (the group list);
3. ``npu_grouped_matmul`` with ``w13 [E, H, 2I]``, ``npu_swiglu``, ``npu_grouped_matmul``
   with ``w2 [E, I, H]``: every expert's FFN over its consecutive rows;
4. ``npu_moe_token_unpermute``: each token's rows weighted by its routing weights, summed.

W8A8-dynamic experts (``routed_experts_w8a8``) quantize each expanded row with
``npu_dynamic_quant`` before each grouped matmul, which then scales by the weight's
per-channel and the row's per-token scale: two more calls per layer.
``routed_experts_w8a8_fused`` is vllm-ascend's single-device W8A8 dynamic sequence, four
calls after routing: ``npu_moe_init_routing_v2(quant_mode=1)`` (the rows come out int8
with their per-row scales), ``npu_grouped_matmul_swiglu_quant`` (``w13`` GEMM, dequant,
swiglu and the per-row re-quantization in one launch; ``w13`` in FRACTAL_NZ, which that
operator requires), the int8 ``w2`` ``npu_grouped_matmul``, ``npu_moe_token_unpermute``.

Weights are in the kernels' ``[E, K, N]`` layout (vLLM loads ``[E, N, K]``; the method
transposes once after loading). Under expert parallelism they hold the rank's experts
only and ``shard`` (``expert_shard.py``) names them: the pairs routed to other ranks' experts
are permuted last and contribute nothing, so the result is this rank's share of the sum.
"""

from __future__ import annotations

import torch

from vllm_ascend_ext.moe.expert_shard import ExpertShard
from vllm_ascend_ext.moe.routing import GATING, RoutingPlan
from vllm_ascend_ext.ops.grouped_matmul import (
    DTYPE_ENUM,
    groups_may_end_early,
    npu_grouped_matmul,
    npu_swiglu,
)
from vllm_ascend_ext.ops.grouped_matmul_swiglu_quant import npu_grouped_matmul_swiglu_quant
from vllm_ascend_ext.ops.moe_dispatch import npu_moe_init_routing_v2, npu_moe_token_unpermute
from vllm_ascend_ext.ops.moe_gating import npu_moe_gating_top_k, npu_moe_gating_top_k_softmax
from vllm_ascend_ext.ops.quant import npu_dynamic_quant


def route(plan: RoutingPlan, router_logits: torch.Tensor,
          bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k], expert ids [T, k] int32) for ``router_logits [T, E]``.

    The kernels return weights in the logits' dtype: half-precision logits are widened
    first, so the weights stay float32 as vLLM's routers keep them (one cast per layer)."""
    if router_logits.dtype in (torch.float16, torch.bfloat16):
        router_logits = router_logits.float()
    if plan.op != GATING:
        weights, ids, _ = npu_moe_gating_top_k_softmax(router_logits, None, k=plan.top_k)
        if plan.renormalize:
            weights = weights / weights.sum(-1, keepdim=True)
        return weights, ids
    if plan.use_bias:
        assert bias is not None
        if bias.dtype != router_logits.dtype:   # the kernel wants one dtype for both
            bias = bias.to(router_logits.dtype)
    weights, ids, norm = npu_moe_gating_top_k(
        router_logits, plan.top_k, bias=bias if plan.use_bias else None,
        k_group=plan.k_group, group_count=plan.group_count,
        group_select_mode=plan.group_select_mode, renorm=0, norm_type=plan.norm_type,
        out_flag=not plan.kernel_renormalizes,
        routed_scaling_factor=plan.scaling if plan.kernel_scales else 1.0)
    if plan.kernel_renormalizes:
        return weights, ids
    if plan.norm_type == 1:              # sigmoid, not renormalised: the unbiased scores
        weights = norm.gather(1, ids.long())
    else:                                # softmax, renormalised
        weights = weights / weights.sum(-1, keepdim=True)
    if plan.scaling != 1.0:
        weights = weights * plan.scaling
    return weights, ids


def sizes_type(groups: torch.Tensor) -> int:
    """``group_list_type`` for a group list of sizes: 1, or 0 (running sums: the same
    number) for a single group, where ``npu_grouped_matmul`` forbids type 1 ("长度不能为1"):
    one expert per rank under wide expert parallelism. A host decision on the shape."""
    return 1 if groups.shape[0] > 1 else 0


def routed_experts(x: torch.Tensor, weights: torch.Tensor | None, ids: torch.Tensor,
                   w13: torch.Tensor, w2: torch.Tensor,
                   shard: ExpertShard | None = None) -> torch.Tensor:
    """``sum_k weights[t, k] * FFN_{ids[t, k]}(x[t])`` for ``x [T, H]``, with
    ``FFN_e(v) = (silu(v @ w13[e][:, :I]) * (v @ w13[e][:, I:])) @ w2[e]``; with a sharded
    ``shard``, the sum over the pairs whose expert is in it (``w13``/``w2`` hold those
    experts in slot order). ``None``: every expert of ``w13``. ``weights`` ``None`` (with
    ``k = 1``): each row's FFN output unweighted, in row order (the all-to-all dispatcher's
    local experts, ``alltoall.py``)."""
    shard = shard or ExpertShard(w13.shape[0], w13.shape[0])
    with groups_may_end_early(shard.is_sharded):
        expanded, row_idx, counts = _dispatch(x, ids, shard)
        groups = shard.groups(counts)
        gate_up = npu_grouped_matmul([expanded], [w13], group_list=groups, split_item=2,
                                     group_type=0, group_list_type=sizes_type(groups))[0]
        down = npu_grouped_matmul([npu_swiglu(gate_up)], [w2], group_list=groups, split_item=2,
                                  group_type=0, group_list_type=sizes_type(groups))[0]
        return _combine(down, row_idx, groups, weights, shard)


def _permute(x: torch.Tensor, ids: torch.Tensor, shard: ExpertShard, quant_mode: int):
    """``npu_moe_init_routing_v2`` over the shard's experts: (rows, row index, counts per
    local expert, per-row scales)."""
    return npu_moe_init_routing_v2(
        x, shard.local_ids(ids), active_num=-1, expert_num=shard.expert_num, drop_pad_mode=0,
        expert_tokens_num_type=1, expert_tokens_num_flag=True, quant_mode=quant_mode,
        active_expert_range=shard.active_range, row_idx_type=0)


def _dispatch(x: torch.Tensor, ids: torch.Tensor, shard: ExpertShard):
    expanded, row_idx, counts, _ = _permute(x, ids, shard, quant_mode=-1)
    return expanded, row_idx, counts


def _combine(down: torch.Tensor, row_idx: torch.Tensor, groups: torch.Tensor,
             weights: torch.Tensor | None, shard: ExpertShard) -> torch.Tensor:
    """Each token's rows weighted and summed (sharded: the foreign rows cleared first)."""
    return npu_moe_token_unpermute(shard.clear_foreign_rows(down, groups), row_idx,
                                   probs=weights)


def _quantized_gmm(rows: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                   counts: torch.Tensor, out_dtype: torch.dtype,
                   list_type: int | None = None) -> torch.Tensor:
    """``list_type`` ``None``: ``counts`` are group sizes (``sizes_type``)."""
    q, per_token = npu_dynamic_quant(rows)
    return npu_grouped_matmul([q], [weight], scale=[scale], per_token_scale=[per_token],
                              group_list=counts, split_item=2, group_type=0,
                              group_list_type=sizes_type(counts) if list_type is None else list_type,
                              output_dtype=DTYPE_ENUM[out_dtype])[0]


def routed_experts_w8a8(x: torch.Tensor, weights: torch.Tensor | None, ids: torch.Tensor,
                        w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor,
                        w2_scale: torch.Tensor, shard: ExpertShard | None = None) -> torch.Tensor:
    """``routed_experts`` with int8 ``w13 [E, H, 2I]`` / ``w2 [E, I, H]`` and their
    per-output-channel scales ``[E, 2I]`` / ``[E, H]``; activations quantized per row."""
    shard = shard or ExpertShard(w13.shape[0], w13.shape[0])
    with groups_may_end_early(shard.is_sharded):
        expanded, row_idx, counts = _dispatch(x, ids, shard)
        groups = shard.groups(counts)
        gate_up = _quantized_gmm(expanded, w13, w13_scale, groups, x.dtype)
        down = _quantized_gmm(npu_swiglu(gate_up), w2, w2_scale, groups, x.dtype)
        return _combine(down, row_idx, groups, weights, shard)


def routed_experts_w8a8_fused(x: torch.Tensor, weights: torch.Tensor | None, ids: torch.Tensor,
                              w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor,
                              w2_scale: torch.Tensor,
                              shard: ExpertShard | None = None) -> torch.Tensor:
    """``routed_experts_w8a8`` (same arguments and result, up to the int8 roundings) in
    four calls: the routing quantizes the expanded rows, the first GEMM's swiglu output
    comes out quantized. ``w13`` must be FRACTAL_NZ (``npu_grouped_matmul_swiglu_quant``
    treats its weight as NZ)."""
    shard = shard or ExpertShard(w13.shape[0], w13.shape[0])
    with groups_may_end_early(shard.is_sharded):
        rows, row_idx, counts, row_scale = _permute(x, ids, shard, quant_mode=1)
        groups = shard.groups(counts)
        # The fused GEMM takes the groups' running sums (vllm-ascend: cumsum_group_list(.., 0)).
        act, act_scale, _ = npu_grouped_matmul_swiglu_quant(rows, w13, groups.cumsum(0), w13_scale,
                                                            row_scale)
        down = npu_grouped_matmul([act], [w2], scale=[w2_scale], per_token_scale=[act_scale],
                                  group_list=groups, split_item=2, group_type=0,
                                  group_list_type=sizes_type(groups),
                                  output_dtype=DTYPE_ENUM[x.dtype])[0]
        return _combine(down, row_idx, groups, weights, shard)


# -- the experts over rows already grouped by expert (the MC2 dispatcher's, ``mc2.py``) ---
# ``ends``: the running row counts per local expert (expert ``j`` over rows
# ``[ends[j-1], ends[j])``), as ``npu_moe_distribute_dispatch_v2`` returns them. The rows
# past ``ends[-1]`` are the dispatch buffer's unfilled tail: computed or not, never read.
# Each takes ``(rows, row_scales, ends, out_dtype)``: float rows (``row_scales`` None), or
# int8 rows with their per-row scales (the dispatch's dynamic quantization, W8A8 experts).

def grouped_ffn(rows: torch.Tensor, row_scales: None, ends: torch.Tensor,
                out_dtype: torch.dtype, *, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """``FFN_j`` (``routed_experts``'s) over each expert's rows, in row order."""
    with groups_may_end_early():
        gate_up = npu_grouped_matmul([rows], [w13], group_list=ends, split_item=2,
                                     group_type=0, group_list_type=0)[0]
        return npu_grouped_matmul([npu_swiglu(gate_up)], [w2], group_list=ends, split_item=2,
                                  group_type=0, group_list_type=0)[0]


def grouped_ffn_w8a8(rows: torch.Tensor, row_scales: torch.Tensor, ends: torch.Tensor,
                     out_dtype: torch.dtype, *, w13: torch.Tensor, w13_scale: torch.Tensor,
                     w2: torch.Tensor, w2_scale: torch.Tensor) -> torch.Tensor:
    """``grouped_ffn`` with int8 experts over int8 rows (``routed_experts_w8a8``'s
    roundings: the first GEMM scales by the rows' own scales, the SwiGLU output is
    quantized per row before the second)."""
    with groups_may_end_early():
        gate_up = npu_grouped_matmul([rows], [w13], scale=[w13_scale], per_token_scale=[row_scales],
                                     group_list=ends, split_item=2, group_type=0,
                                     group_list_type=0, output_dtype=DTYPE_ENUM[out_dtype])[0]
        return _quantized_gmm(npu_swiglu(gate_up), w2, w2_scale, ends, out_dtype, list_type=0)


def grouped_ffn_w8a8_fused(rows: torch.Tensor, row_scales: torch.Tensor, ends: torch.Tensor,
                           out_dtype: torch.dtype, *, w13: torch.Tensor, w13_scale: torch.Tensor,
                           w2: torch.Tensor, w2_scale: torch.Tensor) -> torch.Tensor:
    """``grouped_ffn_w8a8`` with ``routed_experts_w8a8_fused``'s fused first GEMM (``w13``
    FRACTAL_NZ): two calls, vllm-ascend's MC2 W8A8 sequence."""
    with groups_may_end_early():
        act, act_scale, _ = npu_grouped_matmul_swiglu_quant(rows, w13, ends, w13_scale, row_scales)
        return npu_grouped_matmul([act], [w2], scale=[w2_scale], per_token_scale=[act_scale],
                                  group_list=ends, split_item=2, group_type=0, group_list_type=0,
                                  output_dtype=DTYPE_ENUM[out_dtype])[0]
