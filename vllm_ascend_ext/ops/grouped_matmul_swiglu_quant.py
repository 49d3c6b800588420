"""The W8A8 MoE's first expert GEMM, its activation and the re-quantization in one launch:
``torch_npu.npu_grouped_matmul_swiglu_quant``.

Semantics (torch-npu 2.13.0 ``_op_plugin_docs.py`` and its Meta kernel; the halves and
the group list as vllm-ascend calls it, ``vllm_ascend/ops/fused_moe/moe_mlp.py``):

``npu_grouped_matmul_swiglu_quant(x, weight, group_list, weight_scale, x_scale, *,
bias=None, offset=None) -> (output int8 [M, N/2], output_scale fp32 [M], output_offset)``,
"aclnnGroupedMatmulV4、aclnnDynamicDequant、aclnnSwigluQuant融合":

- ``x [M, K]`` int8 ("shape支持2维，数据类型支持INT8"), ``x_scale [M]`` fp32 (its per-row
  quantization factor); ``weight`` int8 ``[E, K, N]`` as the tensor's logical shape (the
  documentation's 5 dimensions are its FRACTAL_NZ storage: "该接口会将weight的数据格式强制视为
  FRACTAL_NZ格式", the cast is the caller's, checked in contract mode);
  ``weight_scale [E, N]`` per output channel (fp32, fp16 or bf16).
- ``group_list [E]`` int64: the groups' running sums (the documentation's "有效数据截至到
  group_list[-1]" and its example's non-decreasing sequence; vllm-ascend passes
  ``cumsum_group_list(group_list, group_list_type, 0)``). Group ``e`` is rows
  ``[group_list[e-1], group_list[e])`` times ``weight[e]``; rows from ``group_list[-1]``
  on are dirty data ("应根据group_list，对结果中脏数据做截断处理"): zero here.
- per row ``m`` of group ``e``: ``h = (x[m] @ weight[e]) * weight_scale[e] * x_scale[m]``
  (int32 accumulation, dequantized in fp32); ``a = silu(h[:N/2]) * h[N/2:]`` (the first
  half is the gate, as ``npu_swiglu``: vllm-ascend's unfused fallback runs ``npu_swiglu``
  on the same ``w13``); then the per-row dynamic quant of ``npu_dynamic_quant``
  (``ops/quant.py``): ``output_scale[m] = rowMax(|a|) / 127``, ``output[m] =
  round(a / output_scale[m])``.
- ``output_offset``: "预留输出，暂不支持"; the official meta gives it shape ``[]`` (a zero
  here). ``bias`` and ``offset`` are "暂不支持" inputs: refused.
"""

from __future__ import annotations

import torch

from vllm_ascend_ext.ops._dispatch import torch_npu_module
from vllm_ascend_ext.ops.counting import npu_op
from vllm_ascend_ext.ops.op_record import NpuOp
from vllm_ascend_ext.ops.quant import dynamic_quant_reference

OP = "npu_grouped_matmul_swiglu_quant"
WEIGHT_SCALE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check(x, weight, group_list, weight_scale, x_scale, bias, offset) -> None:
    if bias is not None or offset is not None:
        raise ValueError(f"{OP}: bias and offset are reserved inputs, documented as not "
                         "supported (暂不支持)")
    if x.dtype != torch.int8 or x.dim() != 2:
        raise ValueError(f"{OP}: x must be 2-D int8 [M, K], got {tuple(x.shape)} {x.dtype}")
    if weight.dtype != torch.int8 or weight.dim() != 3 or weight.shape[1] != x.shape[1]:
        raise ValueError(f"{OP}: weight must be int8 [E, K, N] with K={x.shape[1]}, got "
                         f"{tuple(weight.shape)} {weight.dtype}")
    experts, _, n = weight.shape
    if n % 2:
        raise ValueError(f"{OP}: N={n} must be even (gate and up halves)")
    if group_list.dim() != 1 or group_list.shape[0] != experts or group_list.dtype != torch.int64:
        raise ValueError(f"{OP}: group_list must be 1-D int64 of {experts} entries, got "
                         f"{tuple(group_list.shape)} {group_list.dtype}")
    if tuple(weight_scale.shape) != (experts, n) or weight_scale.dtype not in WEIGHT_SCALE_DTYPES:
        raise ValueError(f"{OP}: weight_scale must be [{experts}, {n}] fp32/fp16/bf16, got "
                         f"{tuple(weight_scale.shape)} {weight_scale.dtype}")
    if tuple(x_scale.shape) != (x.shape[0],) or x_scale.dtype != torch.float32:
        raise ValueError(f"{OP}: x_scale must be fp32 [{x.shape[0]}], got "
                         f"{tuple(x_scale.shape)} {x_scale.dtype}")


def grouped_matmul_swiglu_quant_reference(x, weight, group_list, weight_scale, x_scale, *,
                                          bias=None, offset=None):
    _check(x, weight, group_list, weight_scale, x_scale, bias, offset)
    rows, n = x.shape[0], weight.shape[2]
    # The reference runs on the host: reading the group ends is what the kernel does.
    ends = group_list.tolist()
    if any(b < a for a, b in zip(ends, ends[1:])) or ends[0] < 0 or ends[-1] > rows:
        raise ValueError(f"{OP}: group_list {ends} must be non-decreasing running sums within "
                         f"x's {rows} rows")
    act = torch.zeros((rows, n // 2), dtype=torch.float32, device=x.device)
    begin = 0
    for e, end in enumerate(ends):
        if end > begin:
            acc = (x[begin:end].to(torch.int32) @ weight[e].to(torch.int32)).float()
            h = acc * weight_scale[e].float() * x_scale[begin:end, None]
            gate, up = h.chunk(2, dim=-1)
            act[begin:end] = torch.nn.functional.silu(gate) * up
        begin = end
    out, out_scale = dynamic_quant_reference(act)      # zero rows past group_list[-1]: 0, 0
    return out, out_scale, torch.zeros((), dtype=torch.float32, device=x.device)


def grouped_matmul_swiglu_quant_meta(x, weight, group_list, weight_scale, x_scale, *,
                                     bias=None, offset=None):
    _check(x, weight, group_list, weight_scale, x_scale, bias, offset)
    return (x.new_empty((x.shape[0], weight_scale.shape[-1] // 2), dtype=torch.int8),
            x.new_empty((x.shape[0],), dtype=torch.float32),
            x.new_empty((), dtype=torch.float32))


def grouped_matmul_swiglu_quant_npu(x, weight, group_list, weight_scale, x_scale, *, bias=None,
                                    offset=None):
    return torch_npu_module().npu_grouped_matmul_swiglu_quant(
        x, weight, group_list, weight_scale, x_scale, bias=bias, offset=offset)


@npu_op(OP)
def npu_grouped_matmul_swiglu_quant(x: torch.Tensor, weight: torch.Tensor,
                                    group_list: torch.Tensor, weight_scale: torch.Tensor,
                                    x_scale: torch.Tensor, *, bias=None, offset=None):
    impl = GROUPED_MATMUL_SWIGLU_QUANT.pick(x.device)
    return impl(x, weight, group_list, weight_scale, x_scale, bias=bias, offset=offset)


GROUPED_MATMUL_SWIGLU_QUANT = NpuOp(OP, npu=grouped_matmul_swiglu_quant_npu,
                                   reference=grouped_matmul_swiglu_quant_reference,
                                   meta=grouped_matmul_swiglu_quant_meta, rules="MOE_RULES")
