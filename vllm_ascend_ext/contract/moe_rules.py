"""Documented rules of the MoE operators (routing, dispatch, grouped matmuls, SwiGLU,
combine, and the W8A8 routed experts' fused ones); see rules.py for the form and
op_rules.py for the groups. Quotes are substrings of torch-npu 2.13.0's
``_op_plugin_docs.py`` (checked in tests/ut).
"""

from __future__ import annotations

import torch

from vllm_ascend_ext.contract.rules import (
    Call,
    Departure,
    Rule,
    all_of,
    dims_in,
    dtype_in,
    indices_in_range,
    npu_format_is,
    same_dtype,
    tensor,
    value_in,
    when,
)
from vllm_ascend_ext.ops.format import ACL_FORMAT_FRACTAL_NZ
from vllm_ascend_ext.ops.grouped_matmul import groups_end_early_allowed

F16, BF16, F32, I8, I32, I64 = (torch.float16, torch.bfloat16, torch.float32, torch.int8,
                                torch.int32, torch.int64)

GATE, GATE_SM, INIT, GMM, SWIGLU, UNPERMUTE = (
    "npu_moe_gating_top_k", "npu_moe_gating_top_k_softmax", "npu_moe_init_routing_v2",
    "npu_grouped_matmul", "npu_swiglu", "npu_moe_token_unpermute")


def _expert_num(call: Call) -> int:
    return int(call.values.get("expert_num") or 0)


def _group_list(call: Call) -> str | None:
    groups = tensor(call, "group_list")
    if groups is None:
        return None
    if groups.dtype != I64:
        return f"dtype {groups.dtype}; group_list must be int64"
    if call.values.get("group_list_type") == 1 and groups.numel() == 1:
        return "one group; with group_list_type=1 the list must not have length 1"
    return None


def _group_list_covers_x(call: Call) -> str | None:
    groups, xs = tensor(call, "group_list"), call.values.get("x") or []
    if groups is None or groups.device.type == "meta" or len(xs) != 1:
        return None
    rows = int(groups.sum()) if call.values.get("group_list_type") == 1 else int(groups[-1])
    if rows < xs[0].shape[0] and groups_end_early_allowed():
        # Expert parallelism: x is every (token, k) pair's row, the groups count this rank's
        # experts only; vllm-ascend's all-gather and MC2 dispatchers call the kernel so on
        # A2/A3. The rows past the groups are cleared before anything reads them.
        return Departure("groups ending before x's rows (expert parallelism)")
    if rows != xs[0].shape[0]:
        return f"the groups hold {rows} rows; x has {xs[0].shape[0]}"
    return None


GMM_SQ = "npu_grouped_matmul_swiglu_quant"


def _dynamic_quant(call: Call) -> bool:
    return call.values.get("quant_mode") == 1


def _absent(name: str):
    def check(call: Call) -> str | None:
        return None if call.values.get(name) is None else f"{name} given; documented as not taken"
    return check


def _init_smooth_scale(call: Call) -> str | None:
    scale, x = tensor(call, "scale"), tensor(call, "x")
    if scale is None or x is None:
        return None
    span = call.values.get("active_expert_range") or [0, _expert_num(call)]
    want = (span[1] - span[0], x.shape[1])
    return None if tuple(scale.shape) == want else f"shape {tuple(scale.shape)}; documented {want}"


def _gsq_groups_per_expert(call: Call) -> str | None:
    groups, weight = tensor(call, "group_list"), tensor(call, "weight")
    if groups is None or weight is None or groups.shape[0] == weight.shape[0]:
        return None
    return f"{groups.shape[0]} groups; weight has {weight.shape[0]} experts"


def _gsq_running_sums(call: Call) -> str | None:
    groups, x = tensor(call, "group_list"), tensor(call, "x")
    if groups is None or x is None or groups.device.type == "meta" or groups.numel() == 0:
        return None
    ends = groups.tolist()
    if ends[0] < 0 or any(b < a for a, b in zip(ends, ends[1:])) or ends[-1] > x.shape[0]:
        return f"group_list {ends} is not a non-decreasing running sum within x's {x.shape[0]} rows"
    return None


def _gsq_weight_scale_shape(call: Call) -> str | None:
    scale, weight = tensor(call, "weight_scale"), tensor(call, "weight")
    if scale is None or weight is None:
        return None
    want = (weight.shape[0], weight.shape[-1])
    return None if tuple(scale.shape) == want else f"shape {tuple(scale.shape)}; documented {want}"


def _gsq_x_scale_shape(call: Call) -> str | None:
    scale, x = tensor(call, "x_scale"), tensor(call, "x")
    if scale is None or x is None or tuple(scale.shape) == (x.shape[0],):
        return None
    return f"shape {tuple(scale.shape)}; documented ({x.shape[0]},)"


def _pairs(call: Call) -> int:
    indices = tensor(call, "sorted_indices")
    return 0 if indices is None else indices.numel()


MOE_RULES = (
    Rule(GATE, "x", "数据类型支持`float16`、`bfloat16`、`float32`，数据格式要求为ND。支持非连续Tensor。最后一维",
         dtype_in("x", F16, BF16, F32)),
    Rule(GATE, "bias", "数据类型需要与`x`保持一致", same_dtype("bias", "x")),
    Rule(GATE, "renorm", "当前仅支持`0`", value_in("renorm", 0)),
    Rule(GATE_SM, "x", "表示待计算的输入要求是一个2D/3D的Tensor, 数据类型支持float16、bfloat16、float32",
         dtype_in("x", F16, BF16, F32)),
    Rule(INIT, "expert_idx", "且专家id不能超过专家数。数据类型支持int32",
         all_of(dtype_in("expert_idx", I32), indices_in_range("expert_idx", _expert_num, False))),
    Rule(INIT, "drop_pad_mode", "1表示drop_pad场景。当前仅支持0", value_in("drop_pad_mode", 0)),
    Rule(INIT, "expert_tokens_num_type", "当前仅支持1和2", value_in("expert_tokens_num_type", 1, 2)),
    Rule(INIT, "expert_tokens_num_flag", "当前仅支持True", value_in("expert_tokens_num_flag", True)),
    Rule(INIT, "quant_mode", "当前仅支持-1和1", value_in("quant_mode", -1, 1)),
    Rule(GMM, "group_list", "当group_list_type为1时, group_list必须为非负数列, 且长度不能为1", _group_list),
    Rule(GMM, "group_list", "当group_list_type为1时, 数值的总和与x中tensor的第一维相等", _group_list_covers_x),
    Rule(SWIGLU, "self", "dtype支持FP32、FP16或BF16类型", dtype_in("self", F16, BF16, F32)),
    Rule(UNPERMUTE, "sorted_indices", "取值范围是[0, tokens_num * topK_num - 1]，且没有重复索引",
         all_of(dtype_in("sorted_indices", I32), indices_in_range("sorted_indices", _pairs, False))),
    Rule(UNPERMUTE, "padded_mode", "padded_mode当前仅支持False", value_in("padded_mode", False)),
    # npu_moe_init_routing_v2 in dynamic quant mode (quant_mode=1)
    Rule(INIT, "x", "x数据类型为int8时仅支持-1，不可再量化",
         when(_dynamic_quant, dtype_in("x", F16, BF16, F32))),
    Rule(INIT, "scale", "动态quant场景下，如果输入则要求为2D的Tensor，shape为(expert_end-expert_start, H)",
         when(_dynamic_quant, _init_smooth_scale)),
    Rule(INIT, "offset", "动态quant场景下不输入", when(_dynamic_quant, _absent("offset"))),
    # npu_grouped_matmul_swiglu_quant
    Rule(GMM_SQ, "x", "shape支持2维，数据类型支持INT8，数据格式支持ND",
         all_of(dtype_in("x", I8), dims_in("x", 2))),
    Rule(GMM_SQ, "weight", "数据类型支持INT8，数据格式支持FRACTAL_NZ",
         all_of(dtype_in("weight", I8), npu_format_is("weight", ACL_FORMAT_FRACTAL_NZ)),
         note="'需注意该接口会将weight的数据格式强制视为FRACTAL_NZ格式': an ND weight would be "
              "read as NZ; the plugin casts it once after loading"),
    Rule(GMM_SQ, "group_list", "长度需与weight的首轴维度相等，数据类型支持INT64",
         all_of(dtype_in("group_list", I64), dims_in("group_list", 1), _gsq_groups_per_expert)),
    Rule(GMM_SQ, "group_list", "即有效数据截至到group_list[-1]", _gsq_running_sums,
         note="read as running sums (the example's non-decreasing group_list; vllm-ascend "
              "passes cumsum_group_list(..., 0)); the last one may not exceed x's rows"),
    Rule(GMM_SQ, "weight_scale", "尾轴长度需要与weight还原为ND格式的尾轴相同，数据类型支持FLOAT、FLOAT16、BFLOAT16",
         all_of(dtype_in("weight_scale", F32, F16, BF16), _gsq_weight_scale_shape)),
    Rule(GMM_SQ, "x_scale", "shape支持1维，长度需与x的首轴维度相等，数据类型支持FLOAT",
         all_of(dtype_in("x_scale", F32), _gsq_x_scale_shape)),
    Rule(GMM_SQ, "bias", "bias（可选，暂不支持，Tensor）", _absent("bias")),
    Rule(GMM_SQ, "offset", "offset（可选，暂不支持，Tensor）", _absent("offset")),
)
