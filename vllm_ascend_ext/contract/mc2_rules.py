"""Documented rules of the MC2 operators (``npu_moe_distribute_dispatch_v2`` /
``npu_moe_distribute_combine_v2``); see rules.py for the form.

torch-npu 2.13's wheel documents neither operator (its ``_op_plugin_docs.py`` has no page;
the yaml schemas and official Meta kernels are there and are checked as for every
operator). The rules are hand-written from torch-npu's operator pages in op-plugin
(``ops/moe_distribute_bounds.DOC_PAGES``); each quotes the sentence it rests on. The
size bounds are the table the dispatcher gate uses (``ops/moe_distribute_bounds.py``).
"""

from __future__ import annotations

import torch

from vllm_ascend_ext.contract.rules import HAND_WRITTEN, Call, Rule, dtype_in, tensor, value_in
from vllm_ascend_ext.ops import moe_distribute_bounds as bounds

DISPATCH, COMBINE = "npu_moe_distribute_dispatch_v2", "npu_moe_distribute_combine_v2"
SOURCE = f"{HAND_WRITTEN}: torch-npu's operator documentation, {' and '.join(bounds.DOC_PAGES)}"
F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


def _products(call: Call) -> str | None:
    if call.family in bounds.FAMILIES:
        return None
    return (f"documented for Atlas {'/'.join(bounds.FAMILIES)} only; the pretended SoC is "
            f"{call.soc} ({call.family})")


def _ids(call: Call) -> str | None:
    ids = tensor(call, "expert_ids")
    if ids is None or ids.numel() == 0 or ids.device.type == "meta":
        return None
    experts = int(call.values.get("moe_expert_num") or 0)
    if int(ids.min()) < 0 or int(ids.max()) >= experts:
        return f"expert ids in [{int(ids.min())}, {int(ids.max())}]; must lie in [0, {experts})"
    ordered = torch.sort(ids, dim=1).values
    if bool((ordered[:, 1:] == ordered[:, :-1]).any()):
        return "an expert repeated within a token's row"
    return None


def _sizes(hidden_of: str):
    def check(call: Call) -> str | None:
        x, ids = tensor(call, hidden_of), tensor(call, "expert_ids")
        if x is None or ids is None:
            return None
        why = bounds.outside(call.family, hidden=x.shape[-1], bs=ids.shape[0],
                             top_k=ids.shape[1],
                             experts=int(call.values.get("moe_expert_num") or 0),
                             ep_world_size=int(call.values.get("ep_world_size") or 0))
        return "; ".join(why) or None
    return check


def _global_bs(call: Call) -> str | None:
    ids = tensor(call, "expert_ids")
    gbs, world = int(call.values.get("global_bs") or 0), int(call.values.get("ep_world_size") or 1)
    if ids is None or gbs == 0:
        return None
    if gbs % world or gbs // world < ids.shape[0]:
        return (f"global_bs {gbs} is not max_bs * ep_world_size ({world}) with max_bs >= this "
                f"rank's BS {ids.shape[0]}")
    return None


def _scales(call: Call) -> str | None:
    scales, ids = tensor(call, "expert_scales"), tensor(call, "expert_ids")
    if scales is None or ids is None:
        return "expert_scales missing"
    if scales.dtype != F32 or tuple(scales.shape) != tuple(ids.shape):
        return f"{tuple(scales.shape)} {scales.dtype}; documented [BS, K] = {tuple(ids.shape)} float"
    return None


def _absent_on_a3(name: str):
    def check(call: Call) -> str | None:
        if call.family == "A3" and call.values.get(name) is not None:
            return f"{name} given; not supported on Atlas A3"
        return None
    return check


def _shared_x(call: Call) -> str | None:
    shared, x = tensor(call, "shared_expert_x"), tensor(call, "expand_x")
    if shared is None or x is None:
        return None
    if call.family == "A2":
        return "shared_expert_x given; not supported on Atlas A2"
    if shared.dtype != x.dtype:
        return f"dtype {shared.dtype} differs from expand_x's {x.dtype}"
    return None


def _rule(op: str, argument: str, quote: str, check) -> Rule:
    return Rule(op, argument, quote, check, source=SOURCE)


MC2_RULES = tuple(
    [_rule(op, "*", "产品支持情况: Atlas A3 训练系列产品/Atlas A3 推理系列产品, Atlas A2 训练系列产品/"
                    "Atlas 800I A2 推理产品/A200I A2 Box 异构组件", _products)
     for op in (DISPATCH, COMBINE)]
    + [_rule(op, "expert_ids", "张量里value取值范围为[0, moe_expert_num)，且同一行中的K个value不能重复",
             _ids) for op in (DISPATCH, COMBINE)]
    + [_rule(op, "global_bs", "当每个rank的BS不同时，支持传入max_bs*ep_world_size", _global_bs)
       for op in (DISPATCH, COMBINE)]
    + [
        _rule(DISPATCH, "x", "数据类型支持`bfloat16`、`float16`", dtype_in("x", BF16, F16)),
        _rule(DISPATCH, "x", "H：表示hidden size隐藏层大小 ... BS ... K ... ep_world_size ... "
                             "moe_expert_num (约束说明/参数说明, per product)", _sizes("x")),
        _rule(DISPATCH, "quant_mode", "支持取值：0表示非量化（默认），2表示动态量化",
              value_in("quant_mode", 0, 2)),
        _rule(DISPATCH, "expert_token_nums_type", "取值范围[0, 1]",
              value_in("expert_token_nums_type", 0, 1)),
        _rule(DISPATCH, "expert_scales", "Atlas A3 训练系列产品/Atlas A3 推理系列产品：暂不支持该参数",
              _absent_on_a3("expert_scales")),
        _rule(COMBINE, "expand_x", "数据类型支持bfloat16、float16", dtype_in("expand_x", BF16, F16)),
        _rule(COMBINE, "expand_x", "H：表示hidden size隐藏层大小 ... BS ... K ... ep_world_size ... "
                                   "moe_expert_num (约束说明/参数说明, per product)", _sizes("expand_x")),
        _rule(COMBINE, "expert_scales", "shape为(BS, K) ... 数据类型支持float", _scales),
        _rule(COMBINE, "expand_scales", "Atlas A3 训练系列产品/Atlas A3 推理系列产品：暂不支持该参数",
              _absent_on_a3("expand_scales")),
        _rule(COMBINE, "shared_expert_x", "数据类型需与expand_x保持一致 (A2: 暂不支持该参数)", _shared_x),
    ]
)
