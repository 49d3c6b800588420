"""Token permutation by expert: ``torch_npu.npu_moe_init_routing_v2`` and its inverse,
``npu_moe_token_unpermute``.

Semantics (torch-npu 2.13.0 ``_op_plugin_docs.py``; index conventions from CANN's
``aclnnMoeInitRoutingV3``, which ``npu_moe_init_routing_v2`` lowers to):

- ``npu_moe_init_routing_v2(x [N,H], expert_idx [N,K] int32, *, scale=None, offset=None,
  active_num=-1, expert_capacity=-1, expert_num=-1, drop_pad_mode=0,
  expert_tokens_num_type=0, expert_tokens_num_flag=False, quant_mode=-1,
  active_expert_range=[], row_idx_type=0, x_dtype=None)
  -> (expanded_x, expanded_row_idx int32 [N*K], expert_tokens int64, expanded_scale fp32)``.
  The (token, k) pairs, numbered token-major (``src = n*K + k``), are sorted by expert id,
  stably; pairs whose expert is outside ``active_expert_range = [start, end)`` (default
  ``[0, expert_num)``) sort last and are not valid. ``expanded_x[i] = x[src_i // K]`` for
  the valid rows (the rest are undefined: zero here); with ``active_num > 0`` only the
  first ``min(active_num, N*K)`` rows exist. ``row_idx_type=0`` ("gather"): indexed by
  ``src``, the destination row, -1 for an invalid pair; 1 ("scatter"): indexed by
  destination, the ``src``. ``expert_tokens`` (only with ``expert_tokens_num_flag``):
  per expert of the range, the count (type 1), int64. Type 0 (cumsum) is documented as
  unsupported ("当前仅支持1和2") and refused; type 2 (key-value) is not emulated.
  ``expanded_scale = scale[src // K]`` when a 1-D ``scale`` is given (undefined
  otherwise: zero here). ``quant_mode=1`` (dynamic quant, "1表示动态quant场景"): the
  valid rows are quantized per row as ``npu_dynamic_quant`` does (``ops/quant.py``:
  ``s = rowMax(|xs|) / 127``, ``y = round(xs / s)``), ``expanded_x`` is their int8 ``y``
  and ``expanded_scale`` their fp32 ``s`` ("输出量化计算过程中scale的中间值", shape
  ``(NUM_ROWS*K,)``), zero past the valid rows; ``xs = x[src // K]`` times, when the
  optional 2-D smooth ``scale [expert_end - expert_start, H]`` is given, its row of the
  pair's expert. An int8 ``x`` ("x数据类型为int8时仅支持-1") and an ``offset``
  ("动态quant场景下不输入") are refused. Emulated: dropless (``drop_pad_mode=0``),
  ``quant_mode`` -1 and 1, the count type.
- ``npu_moe_token_unpermute(permuted_tokens [N*K,H], sorted_indices [N*K] int32,
  probs=None [N,K], padded_mode=False, restore_shape=None) -> [N,H]``:
  ``out[n] = sum_k permuted_tokens[sorted_indices[n*K + k]] * probs[n, k]`` (``K = 1``
  without ``probs``); the gather convention of ``row_idx_type=0`` above, so the pair
  undoes ``npu_moe_init_routing_v2``. Indices lie in ``[0, N*K)`` without repeats (so the
  plugin never passes the ``-1`` of a pair outside ``active_expert_range``: under expert
  parallelism every pair is in range, ``moe/expert_shard.py``).
"""

from __future__ import annotations

import torch

from vllm_ascend_ext.ops._dispatch import torch_npu_module
from vllm_ascend_ext.ops.counting import npu_op
from vllm_ascend_ext.ops.op_record import NpuOp
from vllm_ascend_ext.ops.quant import dynamic_quant_reference

INIT_OP, UNPERMUTE_OP = "npu_moe_init_routing_v2", "npu_moe_token_unpermute"
MAX_EXPERT_NUM = 10240


# ------------------------------------------------------------- npu_moe_init_routing_v2
def _check_init(x, expert_idx, scale, offset, active_num, expert_num, drop_pad_mode,
                expert_tokens_num_type, quant_mode, active_expert_range, row_idx_type) -> tuple[int, int]:
    if x.dim() != 2 or expert_idx.dim() != 2 or x.shape[0] != expert_idx.shape[0]:
        raise ValueError(f"npu_moe_init_routing_v2: x [N,H] and expert_idx [N,K] required, got "
                         f"{tuple(x.shape)} and {tuple(expert_idx.shape)}")
    if expert_idx.dtype != torch.int32:
        raise ValueError(f"npu_moe_init_routing_v2: expert_idx must be int32, got {expert_idx.dtype}")
    if drop_pad_mode != 0:
        raise NotImplementedError("npu_moe_init_routing_v2: only dropless (drop_pad_mode=0) is emulated")
    if quant_mode not in (-1, 1):
        raise NotImplementedError(f"npu_moe_init_routing_v2: quant_mode {quant_mode} is not emulated "
                                  "(-1, no quant, and 1, dynamic quant, only)")
    if quant_mode == 1 and x.dtype == torch.int8:
        raise ValueError("npu_moe_init_routing_v2: an int8 x takes quant_mode -1 only "
                         "(documented: x数据类型为int8时仅支持-1，不可再量化)")
    if quant_mode == 1 and offset is not None:
        raise ValueError("npu_moe_init_routing_v2: no offset in dynamic quant mode "
                         "(documented: 动态quant场景下不输入)")
    if expert_tokens_num_type == 0:
        # The kernel's documentation: "取值为0、1和2 ... 当前仅支持1和2" (0, cumsum, is
        # listed and unsupported); the reference refuses it as the NPU would.
        raise ValueError("npu_moe_init_routing_v2: expert_tokens_num_type 0 (cumsum) is "
                         "documented as unsupported (only 1, count, and 2, key-value); use 1")
    if expert_tokens_num_type != 1:
        raise NotImplementedError(f"npu_moe_init_routing_v2: expert_tokens_num_type "
                                  f"{expert_tokens_num_type} is not emulated (1, count, only)")
    if row_idx_type not in (0, 1):
        raise ValueError(f"npu_moe_init_routing_v2: row_idx_type {row_idx_type} (0 or 1)")
    if active_num < -1:
        raise ValueError(f"npu_moe_init_routing_v2: active_num {active_num} must be >= -1")
    if not 0 < expert_num <= MAX_EXPERT_NUM:
        raise ValueError(f"npu_moe_init_routing_v2: expert_num {expert_num} not in (0, {MAX_EXPERT_NUM}]")
    start, end = tuple(active_expert_range) if active_expert_range else (0, expert_num)
    if not 0 <= start < end <= expert_num:
        raise ValueError(f"npu_moe_init_routing_v2: active_expert_range {list(active_expert_range)} "
                         f"must satisfy 0 <= start < end <= expert_num ({expert_num})")
    if scale is not None and quant_mode == -1 and (scale.dim() != 1 or scale.shape[0] != x.shape[0]):
        raise ValueError(f"npu_moe_init_routing_v2: scale {tuple(scale.shape)} must be [{x.shape[0]}] "
                         "without quantization")
    if scale is not None and quant_mode == 1 and tuple(scale.shape) != (end - start, x.shape[1]):
        # The official meta also lets a [1, H] scale through; the documentation gives only
        # (expert_end-expert_start, H), so the reference takes only that.
        raise ValueError(f"npu_moe_init_routing_v2: scale {tuple(scale.shape)} must be "
                         f"[{end - start}, {x.shape[1]}] (expert_end-expert_start, H) in dynamic "
                         "quant mode")
    return start, end


def _rows(x, expert_idx, active_num) -> int:
    pairs = expert_idx.numel()
    return pairs if active_num <= 0 else min(active_num, pairs)


def init_routing_v2_reference(x, expert_idx, *, scale=None, offset=None, active_num=-1,
                              expert_capacity=-1, expert_num=-1, drop_pad_mode=0,
                              expert_tokens_num_type=0, expert_tokens_num_flag=False,
                              quant_mode=-1, active_expert_range=(), row_idx_type=0,
                              x_dtype=None):
    start, end = _check_init(x, expert_idx, scale, offset, active_num, expert_num, drop_pad_mode,
                             expert_tokens_num_type, quant_mode, active_expert_range, row_idx_type)
    k = expert_idx.shape[1]
    flat = expert_idx.reshape(-1).long()
    valid = (flat >= start) & (flat < end)
    order = torch.sort(torch.where(valid, flat, end), stable=True).indices   # dst -> src
    rows = _rows(x, expert_idx, active_num)
    kept = valid[order][:rows]                                               # valid dst rows
    src = order[:rows]
    if quant_mode == 1:
        # Per-row dynamic quant of the expanded rows (npu_dynamic_quant's reference), the
        # optional smooth scale taken per the pair's expert; rows past the valid ones are 0.
        smooth = None if scale is None else scale[(flat[src] - start).clamp(0, end - start - 1)]
        q, row_scale = dynamic_quant_reference(x[src // k], smooth_scales=smooth)
        expanded_x = torch.where(kept[:, None], q, torch.zeros((), dtype=torch.int8))
        expanded_scale = torch.where(kept, row_scale, 0.0)
    else:
        expanded_x = torch.where(kept[:, None], x[src // k], torch.zeros((), dtype=x.dtype))
        expanded_scale = (torch.where(kept, scale.float()[src // k], 0.0) if scale is not None
                          else torch.zeros(rows, dtype=torch.float32, device=x.device))
    if row_idx_type == 1:
        row_idx = order.to(torch.int32)
    else:
        dst = torch.empty_like(order)
        dst[order] = torch.arange(order.numel(), device=order.device)
        row_idx = torch.where(valid & (dst < rows), dst, -1).to(torch.int32)
    if expert_tokens_num_flag:
        counts = torch.zeros(end - start, dtype=torch.int64, device=x.device).scatter_add_(
            0, (flat - start).clamp(0, end - start - 1), valid.long())
        tokens = counts
    else:
        tokens = torch.empty((), dtype=torch.int64, device=x.device)   # as the official meta
    return expanded_x, row_idx, tokens, expanded_scale


def init_routing_v2_meta(x, expert_idx, *, scale=None, offset=None, active_num=-1,
                         expert_capacity=-1, expert_num=-1, drop_pad_mode=0,
                         expert_tokens_num_type=0, expert_tokens_num_flag=False, quant_mode=-1,
                         active_expert_range=(), row_idx_type=0, x_dtype=None):
    start, end = _check_init(x, expert_idx, scale, offset, active_num, expert_num, drop_pad_mode,
                             expert_tokens_num_type, quant_mode, active_expert_range, row_idx_type)
    rows = _rows(x, expert_idx, active_num)
    return (x.new_empty((rows, x.shape[1]), dtype=torch.int8 if quant_mode == 1 else x.dtype),
            x.new_empty((expert_idx.numel(),), dtype=torch.int32),
            x.new_empty((end - start,) if expert_tokens_num_flag else (), dtype=torch.int64),
            x.new_empty((rows,), dtype=torch.float32))


def init_routing_v2_npu(x, expert_idx, **kw):
    kw["active_expert_range"] = list(kw["active_expert_range"])
    return torch_npu_module().npu_moe_init_routing_v2(x, expert_idx, **kw)


@npu_op(INIT_OP)
def npu_moe_init_routing_v2(x: torch.Tensor, expert_idx: torch.Tensor, *, scale=None, offset=None,
                            active_num: int = -1, expert_capacity: int = -1, expert_num: int = -1,
                            drop_pad_mode: int = 0, expert_tokens_num_type: int = 0,
                            expert_tokens_num_flag: bool = False, quant_mode: int = -1,
                            active_expert_range=(), row_idx_type: int = 0, x_dtype=None):
    impl = INIT_ROUTING_V2.pick(x.device)
    return impl(x, expert_idx, scale=scale, offset=offset, active_num=active_num,
                expert_capacity=expert_capacity, expert_num=expert_num,
                drop_pad_mode=drop_pad_mode, expert_tokens_num_type=expert_tokens_num_type,
                expert_tokens_num_flag=expert_tokens_num_flag, quant_mode=quant_mode,
                active_expert_range=tuple(active_expert_range), row_idx_type=row_idx_type,
                x_dtype=x_dtype)


INIT_ROUTING_V2 = NpuOp(INIT_OP, npu=init_routing_v2_npu, reference=init_routing_v2_reference,
                        meta=init_routing_v2_meta, rules="MOE_RULES")


# ------------------------------------------------------------- npu_moe_token_unpermute
def _check_unpermute(permuted_tokens, sorted_indices, probs, padded_mode, restore_shape) -> int:
    if padded_mode or restore_shape is not None:
        raise NotImplementedError("npu_moe_token_unpermute: padded_mode/restore_shape are not supported")
    if permuted_tokens.dim() != 2 or sorted_indices.dim() != 1:
        raise ValueError(f"npu_moe_token_unpermute: permuted_tokens [N*K,H] and sorted_indices [N*K] "
                         f"required, got {tuple(permuted_tokens.shape)} and {tuple(sorted_indices.shape)}")
    k = 1 if probs is None else probs.shape[1]
    if probs is not None and (probs.dim() != 2 or probs.numel() != sorted_indices.numel()):
        raise ValueError(f"npu_moe_token_unpermute: probs {tuple(probs.shape)} must be [N, K] with "
                         f"N*K = {sorted_indices.numel()}")
    return k


def token_unpermute_reference(permuted_tokens, sorted_indices, probs=None, padded_mode=False,
                              restore_shape=None):
    k = _check_unpermute(permuted_tokens, sorted_indices, probs, padded_mode, restore_shape)
    work = torch.float64 if permuted_tokens.dtype == torch.float64 else torch.float32
    rows = permuted_tokens.to(work)[sorted_indices.long()]
    rows = rows.view(-1, k, permuted_tokens.shape[1])
    if probs is not None:
        rows = rows * probs.to(work)[..., None]
    return rows.sum(1).to(permuted_tokens.dtype)


def token_unpermute_meta(permuted_tokens, sorted_indices, probs=None, padded_mode=False,
                         restore_shape=None):
    k = _check_unpermute(permuted_tokens, sorted_indices, probs, padded_mode, restore_shape)
    return permuted_tokens.new_empty((sorted_indices.shape[0] // k, permuted_tokens.shape[1]))


def token_unpermute_npu(permuted_tokens, sorted_indices, probs=None, padded_mode=False,
                        restore_shape=None):
    return torch_npu_module().npu_moe_token_unpermute(
        permuted_tokens, sorted_indices, probs=probs, padded_mode=padded_mode,
        restore_shape=restore_shape)


@npu_op(UNPERMUTE_OP)
def npu_moe_token_unpermute(permuted_tokens: torch.Tensor, sorted_indices: torch.Tensor,
                            probs=None, padded_mode: bool = False, restore_shape=None):
    impl = TOKEN_UNPERMUTE.pick(permuted_tokens.device)
    return impl(permuted_tokens, sorted_indices, probs=probs, padded_mode=padded_mode,
                restore_shape=restore_shape)


TOKEN_UNPERMUTE = NpuOp(UNPERMUTE_OP, npu=token_unpermute_npu, reference=token_unpermute_reference,
                        meta=token_unpermute_meta, rules="MOE_RULES")
