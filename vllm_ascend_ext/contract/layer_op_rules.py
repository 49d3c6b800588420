"""Documented rules of the operators the plugin's layer ops call outside attention and
MoE (``layers/``): RMSNorm with and without the residual add, Gemma's RMSNorm, RoPE,
the add + RmsNorm + dynamic quant a W8A8 MLP consumes (``models/``), and the W8A8 MLP's
dequant + SwiGLU + quant (``layers/w8a8_mlp.py``), and the sampler's top-k / top-p filter
(``worker/npu_sampler.py``).

``npu_rms_norm``'s rules stay in ``op_rules.NORM_QUANT_RULES`` (the SFA path calls it
too); ``npu_swiglu``'s in ``MOE_RULES``. ``npu_add_rms_norm`` has a schema and an
official Meta kernel but no documentation page in the wheel: no rule beyond those.
Quotes are substrings of torch-npu 2.13.0's ``_op_plugin_docs.py`` (checked in tests/ut).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from vllm_ascend_ext.contract.rules import (
    Call,
    Rule,
    all_of,
    contiguous,
    dims_in,
    dtype_in,
    indices_in_range,
    same_dtype,
    tensor,
    value_in,
    when,
)
from vllm_ascend_ext.ops.top_k_top_p import MAX_K as TOP_K_MAX

F16, BF16, F32, I32, I64 = (torch.float16, torch.bfloat16, torch.float32, torch.int32,
                            torch.int64)
GEMMA, MROPE, ARNQ = "npu_gemma_rms_norm", "npu_mrope", "npu_add_rms_norm_dynamic_quant"
DSQ = "npu_dequant_swiglu_quant"
TKTP = "npu_top_k_top_p"


def _not_empty(name: str):
    def check(call: Call) -> str | None:
        t = tensor(call, name)
        return None if t is None or t.numel() else f"{name} is empty {tuple(t.shape)}"
    return check


def _even_last_dim(call: Call) -> str | None:
    x = tensor(call, "x")
    return None if x is None or x.shape[-1] % 2 == 0 else f"last dim {x.shape[-1]} is odd"


def _x_int32(call: Call) -> bool:
    x = tensor(call, "x")
    return x is not None and x.dtype == I32


def _present(name: str):
    def check(call: Call) -> str | None:
        return None if tensor(call, name) is not None else f"{name} is None"
    return check


def _dsq_weight_scale(call: Call) -> str | None:
    x, ws, groups = tensor(call, "x"), tensor(call, "weight_scale"), tensor(call, "group_index")
    n = 1 if groups is None else groups.shape[0]
    if ws is not None and tuple(ws.shape) != (n, x.shape[-1]):
        return f"shape {tuple(ws.shape)}; documented [groupNum, 2H] = [{n}, {x.shape[-1]}]"
    return None


def _dsq_activation_scale(call: Call) -> str | None:
    # [TokensNum] as the parameter text says, or [TokensNum, 1] as its own example passes
    x, s = tensor(call, "x"), tensor(call, "activation_scale")
    if s is not None and tuple(s.shape) not in ((x.shape[0],), (x.shape[0], 1)):
        return f"shape {tuple(s.shape)}; documented [TokensNum] = [{x.shape[0]}]"
    return None


def _dsq_float_x(call: Call) -> str | None:
    x = tensor(call, "x")
    if x is None or x.dtype == I32:
        return None
    given = [n for n in ("weight_scale", "activation_scale", "bias") if tensor(call, n) is not None]
    return f"{', '.join(given)} given with a {x.dtype} x" if given else None


def _dsq_groups(call: Call) -> str | None:
    if tensor(call, "group_index") is None:
        return None
    if call.values.get("quant_mode") != 1:
        return f"quant_mode={call.values.get('quant_mode')} with group_index (dynamic only)"
    given = [n for n in ("bias", "quant_offset") if tensor(call, n) is not None]
    return f"{', '.join(given)} given with group_index" if given else None


def _dsq_group_width(call: Call) -> str | None:
    x = tensor(call, "x")
    if tensor(call, "group_index") is None or x is None:
        return None
    h = x.shape[-1] // 2
    return None if h <= 10496 and h % 64 == 0 else f"H={h} (not <= 10496 and 64-aligned)"


def _p_or_k(call: Call) -> str | None:
    both_none = tensor(call, "p") is None and tensor(call, "k") is None
    return "p and k are both None" if both_none else None


def _batch_vector(name: str):
    def check(call: Call) -> str | None:
        t, logits = tensor(call, name), tensor(call, "logits")
        if t is None or logits is None or tuple(t.shape) == (logits.shape[0],):
            return None
        return f"shape {tuple(t.shape)}; documented 1-D of the logits' first dim {logits.shape[0]}"
    return check


def _values_within(name: str, low, high: Callable[[Call], float]):
    """Every value of ``name`` in ``[low, high(call)]`` (not checked on meta tensors)."""
    def check(call: Call) -> str | None:
        t = tensor(call, name)
        if t is None or t.device.type == "meta" or not t.numel():
            return None
        lo, hi, bound = t.min().item(), t.max().item(), high(call)
        return None if low <= lo and hi <= bound else (
            f"values in [{lo}, {hi}]; documented [{low}, {bound}]")
    return check


def _k_bound(call: Call) -> int:
    logits = tensor(call, "logits")
    return TOP_K_MAX if logits is None else min(TOP_K_MAX, logits.shape[-1])


def _rotary_dim_multiple(call: Call) -> str | None:
    query, cache = tensor(call, "query"), tensor(call, "cos_sin_cache")
    if query is None or cache is None or cache.dim() != 2:
        return None
    multiple = 32 if query.dtype in (F16, BF16) else 16
    rotary_dim = cache.shape[-1]
    if rotary_dim % multiple:
        return (f"rotary_dim {rotary_dim} (cos_sin_cache's last dim) is not a multiple of "
                f"{multiple} for {str(query.dtype).removeprefix('torch.')} input")
    return None


def _rope_mode(call: Call) -> str | None:
    mode = call.values.get("rotary_mode")
    return None if mode in ("half", "interleave") else f"rotary_mode={mode!r}"


def _cache_rows(call: Call) -> int:
    cache = tensor(call, "cos_sin_cache")
    return 0 if cache is None else cache.shape[0]


LAYER_OP_RULES = (
    Rule(GEMMA, "self", "不支持非连续tensor", contiguous("self")),
    Rule(GEMMA, "self", "input: Device侧的Tensor类型，表示输入的需要归一化的数据。shape支持1-8维度，数据格式支持ND。数据类型支持FLOAT32、FLOAT16、BFLOAT16",
         dtype_in("self", F16, BF16, F32)),
    Rule(GEMMA, "gamma", "数据类型支持FLOAT32、FLOAT16、BFLOAT16，与input数据类型保持一致",
         same_dtype("gamma", "self")),
    Rule(ARNQ, "x1", "x1: Tensor类型，标准化输入张量。shape支持2-8维，数据类型支持FLOAT16、BFLOAT16",
         all_of(dtype_in("x1", F16, BF16), dims_in("x1", *range(2, 9)), _not_empty("x1"))),
    Rule(ARNQ, "x2", "x2: Tensor类型，标准化输入张量。shape支持2-8维，数据类型支持FLOAT16、BFLOAT16",
         all_of(dtype_in("x2", F16, BF16), dims_in("x2", *range(2, 9)), _not_empty("x2"))),
    Rule(ARNQ, "gamma", "gamma: Tensor类型，归一化权重张量。shape为1维，需与x1最后一维一致，数据类型与x1一致",
         all_of(dims_in("gamma", 1), same_dtype("gamma", "x1"))),
    Rule(MROPE, "query", "queryIn、keyIn、cosSinCache只支持2维shape输入", dims_in("query", 2)),
    Rule(MROPE, "key", "queryIn、keyIn、cosSinCache只支持2维shape输入", dims_in("key", 2)),
    Rule(MROPE, "cos_sin_cache", "queryIn、keyIn、cosSinCache只支持2维shape输入",
         dims_in("cos_sin_cache", 2)),
    Rule(MROPE, "cos_sin_cache", "当输入是BFLOAT16或FLOAT16时，rotary_dim要求是32的倍数",
         _rotary_dim_multiple),
    Rule(MROPE, "positions", "数据类型支持INT32、INT64，数据格式支持ND",
         all_of(dtype_in("positions", I32, I64), dims_in("positions", 1, 2))),
    Rule(MROPE, "positions", "当输入tensor positions中值域超过cosSinCache的0维maxSeqLen，会有越界报错",
         indices_in_range("positions", _cache_rows, negative_ok=False)),
    Rule(MROPE, "rotary_mode", "'half'表示rotate_half(GPT-NeoX style)计算模式，'interleave'表示",
         _rope_mode),
    Rule(DSQ, "x", "尾轴为偶数。数据类型支持int32和bfloat16",
         all_of(dtype_in("x", I32, BF16), dims_in("x", 2), _even_last_dim)),
    Rule(DSQ, "weight_scale", "表示权重量化对应的反量化系数。要求是2D的Tensor",
         when(_x_int32, all_of(_present("weight_scale"), dtype_in("weight_scale", F32),
                               _dsq_weight_scale))),
    Rule(DSQ, "activation_scale", "表示per-token权重量化对应的反量化系数。要求是1D的Tensor",
         when(_x_int32, all_of(_present("activation_scale"), dtype_in("activation_scale", F32),
                               _dsq_activation_scale))),
    Rule(DSQ, "x", "时，weight_scale、activation_scale、bias 必须为 None", _dsq_float_x),
    Rule(DSQ, "quant_mode", "量化模式，0 表示静态量化，1 表示动态量化", value_in("quant_mode", 0, 1)),
    Rule(DSQ, "group_index", "仅支持动态量化（quant_mode=1），且 bias、quant_offset 必须为 None",
         _dsq_groups),
    Rule(DSQ, "group_index", "H≤10496同时64对齐场景", _dsq_group_width),
    Rule(TKTP, "logits", "输入张量，支持2维，数据类型支持torch.bfloat16, torch.float16, torch.float32",
         all_of(dims_in("logits", 2), dtype_in("logits", F16, BF16, F32))),
    Rule(TKTP, "p", "不支持p和k同时传None", _p_or_k),
    Rule(TKTP, "p", "表示top-p的阈值，值域为[0, 1]",
         all_of(same_dtype("p", "logits"), _batch_vector("p"),
                _values_within("p", 0.0, lambda call: 1.0))),
    Rule(TKTP, "k", "表示top-k的阈值，值域为[1, 1024]，且最大值需要小于等于logits.size(1)",
         all_of(dtype_in("k", I32), _batch_vector("k"), _values_within("k", 1, _k_bound))),
)
