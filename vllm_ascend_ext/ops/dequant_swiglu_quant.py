"""A W8A8 MLP's activation in one launch: ``torch_npu.npu_dequant_swiglu_quant``.

``npu_dequant_swiglu_quant(x, *, weight_scale=None, activation_scale=None, bias=None,
quant_scale=None, quant_offset=None, group_index=None, activate_left=False, quant_mode=0,
swiglu_mode=0, ...) -> (y int8 [T, H], scale fp32 [T])``: "对输入张量 x 进行反量化、Swiglu
激活计算及量化" (torch-npu 2.13.0 ``_op_plugin_docs.py``; documented for A2 and A3).

Semantics as documented:

- ``x [T, 2H]`` int32 (the raw accumulation of an int8 GEMM: ``npu_quant_matmul`` with
  ``output_dtype=torch.int32``) or fp16/bf16. For int32 ``weight_scale [groupNum, 2H]``
  fp32 and ``activation_scale [T]`` fp32 (per-token) are required and dequantize:
  ``h = (x [+ int32 bias]) * weight_scale[g] * activation_scale[t]`` in fp32; for
  fp16/bf16 they must be None.
- ``activate_left=True``: ``a = swish(h[:, :H]) * h[:, H:]`` (the first half is the gate,
  vLLM's ``SiluAndMul`` layout); False: ``a = swish(h[:, H:]) * h[:, :H]``.
- ``quant_scale [groupNum, H]``: smooth-quant factors, ``a = a * quant_scale[g]``.
- ``quant_mode=1`` (dynamic): per row ``scale = rowMax(|a|) / 127``,
  ``y = round(a / scale)``, as ``npu_dynamic_quant`` (``ops/quant.py``).
- ``group_index [groupNum]`` int64, count mode: consecutive row groups, group ``g`` using
  row ``g`` of ``weight_scale`` / ``quant_scale``; only with ``quant_mode=1`` and without
  ``bias`` / ``quant_offset``; rows past the counts' sum are garbage on the NPU (zero here).
  Without it ``groupNum`` is 1.

Not emulated (``NotImplementedError``): static quantization (``quant_mode=0``: the docs
give no formula for ``quant_scale`` / ``quant_offset`` there), the SwiGLU variant
(``swiglu_mode=1``), and the schema-only ``dst_type`` / ``round_mode`` / ``activate_dim``
(int8 output, the last dim). The plugin calls it with int32 ``x``, no groups,
``activate_left=True``, ``quant_mode=1`` (``layers/w8a8_mlp.py``).
"""

from __future__ import annotations

import torch

from vllm_ascend_ext.ops._dispatch import torch_npu_module
from vllm_ascend_ext.ops.counting import npu_op
from vllm_ascend_ext.ops.op_record import NpuOp
from vllm_ascend_ext.ops.quant import dynamic_quant_reference

OP = "npu_dequant_swiglu_quant"


def _check(x, weight_scale, activation_scale, bias, quant_scale, quant_offset, group_index,
           quant_mode, swiglu_mode, dst_type, round_mode, activate_dim) -> None:
    if quant_mode != 1:
        raise NotImplementedError(f"{OP}: quant_mode={quant_mode} (static) is not emulated; "
                                  "the plugin calls quant_mode=1 (dynamic)")
    if swiglu_mode != 0:
        raise NotImplementedError(f"{OP}: swiglu_mode={swiglu_mode} (the variant) is not "
                                  "emulated")
    if (dst_type, round_mode, activate_dim) not in ((None, None, None), (None, None, -1)):
        raise NotImplementedError(f"{OP}: dst_type/round_mode/activate_dim are not emulated "
                                  "(int8 output, activation over the last dim)")
    if x.dim() != 2 or x.shape[1] % 2:
        raise ValueError(f"{OP}: x must be 2-D [T, 2H] with an even last dim, got "
                         f"{tuple(x.shape)}")
    if quant_offset is not None:
        raise NotImplementedError(f"{OP}: quant_offset is static quantization's, not emulated")
    rows, width = x.shape
    groups = 1 if group_index is None else group_index.shape[0]
    if x.dtype == torch.int32:
        if weight_scale is None or activation_scale is None:
            raise ValueError(f"{OP}: an int32 x needs weight_scale and activation_scale")
        if tuple(weight_scale.shape) != (groups, width) or weight_scale.dtype != torch.float32:
            raise ValueError(f"{OP}: weight_scale must be fp32 [{groups}, {width}], got "
                             f"{tuple(weight_scale.shape)} {weight_scale.dtype}")
        if (activation_scale.numel() != rows or activation_scale.dtype != torch.float32
                or activation_scale.dim() not in (1, 2)):
            raise ValueError(f"{OP}: activation_scale must be fp32 [{rows}], got "
                             f"{tuple(activation_scale.shape)} {activation_scale.dtype}")
    elif x.dtype in (torch.float16, torch.bfloat16):
        if weight_scale is not None or activation_scale is not None or bias is not None:
            raise ValueError(f"{OP}: weight_scale, activation_scale and bias must be None for "
                             f"a {x.dtype} x")
    else:
        raise ValueError(f"{OP}: x must be int32, float16 or bfloat16, got {x.dtype}")
    if bias is not None and (group_index is not None or bias.dtype != torch.int32
                             or bias.shape[-1] != width):
        raise ValueError(f"{OP}: bias must be int32 ending in {width}, and None with "
                         "group_index")
    if quant_scale is not None and tuple(quant_scale.shape) != (groups, width // 2):
        raise ValueError(f"{OP}: quant_scale must be [{groups}, {width // 2}], got "
                         f"{tuple(quant_scale.shape)}")
    if group_index is not None and (group_index.dim() != 1 or group_index.dtype != torch.int64):
        raise ValueError(f"{OP}: group_index must be 1-D int64 (counts), got "
                         f"{tuple(group_index.shape)} {group_index.dtype}")


def _row_groups(rows: int, group_index) -> list[tuple[int, int]]:
    if group_index is None:
        return [(0, rows)]
    # The reference runs on the host: reading the counts is what the kernel does.
    counts = group_index.tolist()
    if any(c < 0 for c in counts) or sum(counts) > rows:
        raise ValueError(f"{OP}: group_index {counts} must be non-negative counts summing "
                         f"to at most {rows} rows")
    bounds, begin = [], 0
    for c in counts:
        bounds.append((begin, begin + c))
        begin += c
    return bounds


def dequant_swiglu_quant_reference(x, *, weight_scale=None, activation_scale=None, bias=None,
                                   quant_scale=None, quant_offset=None, group_index=None,
                                   activate_left=False, quant_mode=0, dst_type=None,
                                   round_mode=None, activate_dim=None, swiglu_mode=0,
                                   clamp_limit=7.0, glu_alpha=1.702, glu_bias=1.0):
    _check(x, weight_scale, activation_scale, bias, quant_scale, quant_offset, group_index,
           quant_mode, swiglu_mode, dst_type, round_mode, activate_dim)
    rows, width = x.shape
    act = torch.zeros((rows, width // 2), dtype=torch.float32, device=x.device)
    for g, (begin, end) in enumerate(_row_groups(rows, group_index)):
        if end == begin:
            continue
        h = x[begin:end]
        if x.dtype == torch.int32:
            if bias is not None:
                h = h + bias
            h = h.float() * weight_scale[g] * activation_scale.reshape(-1)[begin:end, None]
        else:
            h = h.float()
        first, second = h.chunk(2, dim=-1)
        gate, up = (first, second) if activate_left else (second, first)
        a = torch.nn.functional.silu(gate) * up
        if quant_scale is not None:
            a = a * quant_scale[g].float()
        act[begin:end] = a
    return dynamic_quant_reference(act)


def dequant_swiglu_quant_meta(x, *, weight_scale=None, activation_scale=None, bias=None,
                              quant_scale=None, quant_offset=None, group_index=None,
                              activate_left=False, quant_mode=0, dst_type=None, round_mode=None,
                              activate_dim=None, swiglu_mode=0, clamp_limit=7.0,
                              glu_alpha=1.702, glu_bias=1.0):
    _check(x, weight_scale, activation_scale, bias, quant_scale, quant_offset, group_index,
           quant_mode, swiglu_mode, dst_type, round_mode, activate_dim)
    return (x.new_empty((x.shape[0], x.shape[1] // 2), dtype=torch.int8),
            x.new_empty((x.shape[0],), dtype=torch.float32))


def dequant_swiglu_quant_npu(x, **kw):
    return torch_npu_module().npu_dequant_swiglu_quant(x, **kw)


@npu_op(OP)
def npu_dequant_swiglu_quant(x: torch.Tensor, *, weight_scale=None, activation_scale=None,
                             bias=None, quant_scale=None, quant_offset=None, group_index=None,
                             activate_left: bool = False, quant_mode: int = 0):
    impl = DEQUANT_SWIGLU_QUANT.pick(x.device)
    return impl(x, weight_scale=weight_scale, activation_scale=activation_scale, bias=bias,
                quant_scale=quant_scale, quant_offset=quant_offset, group_index=group_index,
                activate_left=activate_left, quant_mode=quant_mode)


DEQUANT_SWIGLU_QUANT = NpuOp(OP, npu=dequant_swiglu_quant_npu,
                             reference=dequant_swiglu_quant_reference,
                             meta=dequant_swiglu_quant_meta, rules="LAYER_OP_RULES")
