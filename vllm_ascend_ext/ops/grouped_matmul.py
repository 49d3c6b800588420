"""Per-expert GEMMs and the gated activation between them: ``torch_npu.npu_grouped_matmul``
and ``torch_npu.npu_swiglu``.

Semantics (torch-npu 2.13.0 ``_op_plugin_docs.py`` and its Meta kernels):

- ``npu_grouped_matmul(x: list, weight: list, *, ..., group_list=None, split_item=0,
  group_type=None, group_list_type=0, act_type=0, output_dtype=None, ...) -> list``:
  ``y_i = x_i @ weight_i (+ bias_i)``. The MoE form, the only one emulated: one 2-D
  ``x [M, K]`` whose rows are consecutive groups, one 3-D ``weight [E, K, N]``,
  ``group_type=0`` (groups along M), ``split_item`` 2 or 3 (one output ``[M, N]``), and a
  tensor ``group_list`` of E entries: the group sizes (``group_list_type=1``) or their
  running sums (0, the last equal to M). Group ``e`` is rows ``[end_{e-1}, end_e)`` times
  ``weight[e]``. The documentation asks the groups to cover M exactly. Under expert
  parallelism the plugin passes the permutation's ``N*K`` rows with only the rank's
  experts counted, so the groups end before M (vllm-ascend's all-gather and MC2
  dispatchers call the kernel so on A2/A3): only inside ``groups_may_end_early()`` does the
  reference take such groups, and it fills the rows past them with NaN (undefined on the
  NPU), so a caller that mixes them into kept rows or a sum is caught; elsewhere it
  refuses them. W8A8 (per-channel ``scale`` with
  ``per_token_scale``, int8 ``x``/``weight``): ``y = (x @ w) * scale_e[n] *
  per_token_scale[m]`` in ``output_dtype``. Activations, anti-quantisation, offsets and the
  N/K splits are not emulated.
- ``npu_swiglu(x, dim=-1)``: ``A, B = x.chunk(2, dim)``; ``silu(A) * B``.
"""

from __future__ import annotations

import contextlib
import contextvars

import torch

from vllm_ascend_ext.ops._dispatch import torch_npu_module
from vllm_ascend_ext.ops.compiled import LAYER_KERNEL_DTYPES, emulation_kernel
from vllm_ascend_ext.ops.counting import npu_op
from vllm_ascend_ext.ops.op_record import NpuOp

GMM_OP, SWIGLU_OP = "npu_grouped_matmul", "npu_swiglu"
SWIGLU_KERNEL = "emu_swiglu"
MAX_GROUPS = 1024
# ``output_dtype`` of the Tensor overload is an int: c10's ScalarType number (the wheel's
# Meta kernels map it back with TORCH_DTYPE_ENUM_VALUE_TO_SCALAR_TYPE_MAP).
DTYPE_ENUM = {torch.int8: 1, torch.int32: 3, torch.float16: 5, torch.float32: 6,
              torch.bfloat16: 15}
OUTPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.int32)  # official meta
_ENUM_DTYPE = {v: k for k, v in DTYPE_ENUM.items()}
_UNEMULATED = ("bias", "offset", "antiquant_scale", "antiquant_offset", "activation_input",
               "activation_quant_scale", "activation_quant_offset", "tuning_config")


# ------------------------------------------------------------------ npu_grouped_matmul
_GROUPS_MAY_END_EARLY = contextvars.ContextVar("ascend_ext_groups_may_end_early", default=False)


@contextlib.contextmanager
def groups_may_end_early(allowed: bool = True):
    """Calls inside may pass groups ending before x's rows when ``allowed`` (expert
    parallelism, the one departure from the documentation the plugin makes on purpose:
    ``moe/expert_shard.py``); ``allowed=False`` keeps the documented exact cover."""
    token = _GROUPS_MAY_END_EARLY.set(allowed)
    try:
        yield
    finally:
        _GROUPS_MAY_END_EARLY.reset(token)


def groups_end_early_allowed() -> bool:
    return _GROUPS_MAY_END_EARLY.get()


# What a captured call of these operators carries into every replay of its graph
# (emulation/cpu_npu_graph.py): the declaration made around it.
KERNEL_CONTEXT = (_GROUPS_MAY_END_EARLY,)


def _check_gmm(x, weight, group_list, split_item, group_type, group_list_type, act_type,
               scale, per_token_scale, output_dtype, unemulated) -> torch.dtype:
    given = [name for name, value in unemulated.items() if value is not None]
    if given:
        raise NotImplementedError(f"npu_grouped_matmul: {', '.join(given)} not emulated")
    if len(x) != 1 or len(weight) != 1 or x[0].dim() != 2 or weight[0].dim() != 3:
        raise NotImplementedError("npu_grouped_matmul: only one 2-D x and one 3-D weight [E,K,N] "
                                  "(the MoE form) are emulated")
    if group_type != 0 or split_item not in (2, 3):
        raise NotImplementedError(f"npu_grouped_matmul: group_type {group_type} / split_item "
                                  f"{split_item}; the MoE form is group_type=0, split_item 2 or 3")
    if act_type != 0:
        raise NotImplementedError(f"npu_grouped_matmul: act_type {act_type} is not emulated")
    experts, k, _ = weight[0].shape
    if x[0].shape[1] != k:
        raise ValueError(f"npu_grouped_matmul: x {tuple(x[0].shape)} and weight {tuple(weight[0].shape)} "
                         "disagree on K")
    if group_list is None or group_list.dim() != 1 or group_list.shape[0] != experts:
        raise ValueError(f"npu_grouped_matmul: group_list must be a 1-D tensor of {experts} groups")
    if experts > MAX_GROUPS:
        raise ValueError(f"npu_grouped_matmul: {experts} groups; at most {MAX_GROUPS}")
    if group_list_type not in (0, 1):
        raise ValueError(f"npu_grouped_matmul: group_list_type {group_list_type} (0 cumsum, 1 counts)")
    quantized = x[0].dtype == torch.int8
    if quantized != (weight[0].dtype == torch.int8) or quantized != (scale is not None):
        raise ValueError("npu_grouped_matmul: int8 x, int8 weight and scale go together")
    if per_token_scale is not None and not quantized:
        raise ValueError("npu_grouped_matmul: per_token_scale needs int8 x and weight")
    if output_dtype is None:
        if quantized:
            raise ValueError("npu_grouped_matmul: int8 inputs need an output_dtype")
        return x[0].dtype
    if _ENUM_DTYPE.get(output_dtype) not in OUTPUT_DTYPES:
        raise ValueError(f"npu_grouped_matmul: output_dtype {output_dtype} not supported "
                         f"(fp16, bf16, fp32, int32: {[DTYPE_ENUM[d] for d in OUTPUT_DTYPES]})")
    return _ENUM_DTYPE[output_dtype]


def _ends(group_list: torch.Tensor, group_list_type: int) -> list[int]:
    # The reference runs on the host: reading the group sizes here is what the kernel
    # does on the device.
    ends = group_list.long().cumsum(0) if group_list_type == 1 else group_list.long()
    return ends.tolist()


def grouped_matmul_reference(x, weight, *, bias=None, scale=None, offset=None,
                             antiquant_scale=None, antiquant_offset=None, per_token_scale=None,
                             group_list=None, activation_input=None, activation_quant_scale=None,
                             activation_quant_offset=None, split_item=0, group_type=None,
                             group_list_type=0, act_type=0, tuning_config=None,
                             output_dtype=None, x_dtype=None, weight_dtype=None,
                             scale_dtype=None, per_token_scale_dtype=None):
    unemulated = dict(zip(_UNEMULATED, (bias, offset, antiquant_scale, antiquant_offset,
                                        activation_input, activation_quant_scale,
                                        activation_quant_offset, tuning_config)))
    out_dtype = _check_gmm(x, weight, group_list, split_item, group_type, group_list_type,
                           act_type, scale, per_token_scale, output_dtype, unemulated)
    a, w = x[0], weight[0]
    quantized = a.dtype == torch.int8
    work = torch.float64 if torch.float64 in (a.dtype, w.dtype) else torch.float32
    ends = _ends(group_list, group_list_type)
    early = groups_end_early_allowed()
    if (ends[-1] > a.shape[0] or (ends[-1] < a.shape[0] and not early)
            or any(b < a_ for a_, b in zip(ends, ends[1:])) or ends[0] < 0):
        raise ValueError(f"npu_grouped_matmul: group_list {group_list.tolist()} (type "
                         f"{group_list_type}) must cover x's {a.shape[0]} rows exactly, "
                         "with non-negative group sizes (groups ending before the rows: "
                         "only under expert parallelism)")
    # rows past the groups: undefined on the NPU, NaN here (int32 output: its minimum)
    fill = float("nan") if out_dtype.is_floating_point else torch.iinfo(out_dtype).min
    out = torch.full((a.shape[0], w.shape[2]), fill, dtype=work, device=a.device)
    begin = 0
    for e, end in enumerate(ends):
        if end > begin:
            if quantized:
                acc = (a[begin:end].to(torch.int32) @ w[e].to(torch.int32)).to(work)
                acc = acc * scale[0][e].to(work)
                if per_token_scale is not None:
                    acc = acc * per_token_scale[0][begin:end, None].to(work)
            else:
                acc = a[begin:end].to(work) @ w[e].to(work)
            out[begin:end] = acc
        begin = max(begin, end)
    return [out.to(out_dtype)]


def grouped_matmul_meta(x, weight, *, bias=None, scale=None, offset=None, antiquant_scale=None,
                        antiquant_offset=None, per_token_scale=None, group_list=None,
                        activation_input=None, activation_quant_scale=None,
                        activation_quant_offset=None, split_item=0, group_type=None,
                        group_list_type=0, act_type=0, tuning_config=None, output_dtype=None,
                        x_dtype=None, weight_dtype=None, scale_dtype=None,
                        per_token_scale_dtype=None):
    unemulated = dict(zip(_UNEMULATED, (bias, offset, antiquant_scale, antiquant_offset,
                                        activation_input, activation_quant_scale,
                                        activation_quant_offset, tuning_config)))
    out_dtype = _check_gmm(x, weight, group_list, split_item, group_type, group_list_type,
                           act_type, scale, per_token_scale, output_dtype, unemulated)
    return [x[0].new_empty((x[0].shape[0], weight[0].shape[2]), dtype=out_dtype)]


def grouped_matmul_npu(x, weight, **kw):
    return torch_npu_module().npu_grouped_matmul(x, weight, **kw)


@npu_op(GMM_OP)
def npu_grouped_matmul(x: list[torch.Tensor], weight: list[torch.Tensor], *, scale=None,
                       per_token_scale=None, group_list=None, split_item: int = 2,
                       group_type: int = 0, group_list_type: int = 1, output_dtype=None):
    impl = GROUPED_MATMUL.pick(x[0].device)
    return impl(x, weight, scale=scale, per_token_scale=per_token_scale, group_list=group_list,
                split_item=split_item, group_type=group_type, group_list_type=group_list_type,
                output_dtype=output_dtype)


GROUPED_MATMUL = NpuOp(GMM_OP, npu=grouped_matmul_npu, reference=grouped_matmul_reference,
                       meta=grouped_matmul_meta, rules="MOE_RULES")


# ------------------------------------------------------------------------- npu_swiglu
def _check_swiglu(x, dim) -> None:
    if x.shape[dim] % 2:
        raise ValueError(f"npu_swiglu: dim {dim} of {tuple(x.shape)} must be even")


def swiglu_reference(x, dim=-1):
    _check_swiglu(x, dim)
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    a, b = x.to(work).chunk(2, dim=dim)
    return (torch.nn.functional.silu(a) * b).to(x.dtype)


def swiglu_emulated(x, dim=-1):
    """The compiled kernel (``csrc/emu_layer_ops.cpp``: one pass, the reference's working
    precision, one rounding) over the last dim of a contiguous ``x``; else the reference."""
    _check_swiglu(x, dim)
    kernel = emulation_kernel(SWIGLU_KERNEL, x.device)
    if (kernel is None or dim not in (-1, x.dim() - 1) or x.dtype not in LAYER_KERNEL_DTYPES
            or not x.is_contiguous()):
        return swiglu_reference(x, dim)
    return kernel(x)


def swiglu_meta(x, dim=-1):
    _check_swiglu(x, dim)
    shape = list(x.shape)
    shape[dim] //= 2
    return x.new_empty(shape)


def swiglu_npu(x, dim=-1):
    return torch_npu_module().npu_swiglu(x, dim=dim)


@npu_op(SWIGLU_OP)
def npu_swiglu(x: torch.Tensor, dim: int = -1):
    impl = SWIGLU.pick(x.device)
    return impl(x, dim=dim)


SWIGLU = NpuOp(SWIGLU_OP, npu=swiglu_npu, reference=swiglu_reference, meta=swiglu_meta,
               emulation=swiglu_emulated, kernel=SWIGLU_KERNEL, rules="MOE_RULES")
