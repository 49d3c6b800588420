"""MoE routing: ``torch_npu.npu_moe_gating_top_k`` and ``npu_moe_gating_top_k_softmax``.

Semantics (torch-npu 2.13.0 ``_op_plugin_docs.py``; the formula of the first, which the
wheel does not spell out, from CANN's ``aclnnMoeGatingTopK`` documentation and golden):

- ``npu_moe_gating_top_k(x [N,E], k, *, bias=None, k_group=1, group_count=1,
  group_select_mode=0, renorm=0, norm_type=0, out_flag=False, routed_scaling_factor=1.0,
  eps=1e-20) -> (y [N,k] x.dtype, expert_idx [N,k] int32, norm_out [N,E] float32)``:
  ``norm = softmax(x)`` (``norm_type=0``) or ``sigmoid(x)`` (1), in float32; experts are
  *selected* on ``norm + bias`` (the bias never enters the weights); with
  ``group_count > 1`` the experts form equal groups scored by their max
  (``group_select_mode=0``) or the sum of their two best (1), and only the ``k_group``
  best groups stay eligible; the ``k`` best eligible experts, best first (ties: lower
  expert id first), give ``y = norm[expert]``, divided by ``sum + eps`` in sigmoid mode
  (softmax mode with ``renorm=0``, the only documented value, is not renormalised), times
  ``routed_scaling_factor``. Documented bounds: ``E <= 2048``, ``E / group_count > 2``,
  ``1 <= k_group <= group_count``, ``1 <= k <= E / group_count * k_group``. Hash mode
  (``input_ids``/``tid2eid``) is not emulated.
- ``npu_moe_gating_top_k_softmax(x [N,E], finished=None, k=1) -> (y [N,k] x.dtype,
  expert_idx [N,k] int32, row_idx [N,k] int32)``: softmax over experts, top ``k`` best
  first (float16 input ranked on half-precision probabilities, bfloat16 and float32 on
  float32 ones; ties: lower expert id first); ``row_idx[n, j] = j * N + n`` (k-major,
  the layout ``npu_moe_init_routing`` reads); a ``finished`` row gets expert id ``E``. ``0 < k <= min(E, 1024)``; 2-D only.
"""

from __future__ import annotations

import torch

from vllm_ascend_ext.ops._dispatch import torch_npu_module
from vllm_ascend_ext.ops.counting import npu_op
from vllm_ascend_ext.ops.op_record import NpuOp

GATE_OP, GATE_SOFTMAX_OP = "npu_moe_gating_top_k", "npu_moe_gating_top_k_softmax"
MAX_EXPERTS = 2048
MAX_SOFTMAX_K = 1024


# ------------------------------------------------------------------ npu_moe_gating_top_k
def _check_gating(x, k, bias, input_ids, tid2eid, k_group, group_count, group_select_mode,
                  renorm, norm_type) -> None:
    if input_ids is not None or tid2eid is not None:
        raise NotImplementedError("npu_moe_gating_top_k: hash mode (input_ids/tid2eid) is not emulated")
    if x.dim() != 2:
        raise ValueError(f"npu_moe_gating_top_k: x must be 2-D [tokens, experts], got {tuple(x.shape)}")
    experts = x.shape[1]
    if experts > MAX_EXPERTS:
        raise ValueError(f"npu_moe_gating_top_k: {experts} experts; at most {MAX_EXPERTS}")
    if norm_type not in (0, 1):
        raise ValueError(f"npu_moe_gating_top_k: norm_type {norm_type} (0 softmax, 1 sigmoid)")
    if renorm != 0:
        raise ValueError(f"npu_moe_gating_top_k: renorm {renorm}; only 0 is supported")
    if group_select_mode not in (0, 1):
        raise ValueError(f"npu_moe_gating_top_k: group_select_mode {group_select_mode} (0 or 1)")
    if group_count < 1 or experts % group_count or experts // group_count <= 2:
        raise ValueError(f"npu_moe_gating_top_k: {experts} experts in {group_count} groups; the "
                         "group size must be a whole number greater than 2")
    if not 1 <= k_group <= group_count:
        raise ValueError(f"npu_moe_gating_top_k: k_group {k_group} not in [1, {group_count}]")
    if not 1 <= k <= experts // group_count * k_group:
        raise ValueError(f"npu_moe_gating_top_k: k {k} not in [1, {experts // group_count * k_group}]")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != experts):
        raise ValueError(f"npu_moe_gating_top_k: bias {tuple(bias.shape)} must be [{experts}]")


def _descending(scores: torch.Tensor) -> torch.Tensor:
    """Indices of ``scores`` best first along the last dim; ties keep the lower index first."""
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices


def gating_top_k_reference(x, k, *, bias=None, input_ids=None, tid2eid=None, k_group=1,
                           group_count=1, group_select_mode=0, renorm=0, norm_type=0,
                           out_flag=False, routed_scaling_factor=1.0, eps=1e-20):
    _check_gating(x, k, bias, input_ids, tid2eid, k_group, group_count, group_select_mode,
                  renorm, norm_type)
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    norm = torch.softmax(x.to(work), -1) if norm_type == 0 else torch.sigmoid(x.to(work))
    select = norm if bias is None else norm + bias.to(work)
    if group_count > 1:
        n, experts = select.shape
        grouped = select.view(n, group_count, experts // group_count)
        score = (grouped.max(-1).values if group_select_mode == 0
                 else grouped.topk(2, dim=-1).values.sum(-1))
        kept = _descending(score)[:, :k_group]
        eligible = torch.zeros_like(score, dtype=torch.bool).scatter_(1, kept, True)
        eligible = eligible.repeat_interleave(experts // group_count, dim=1)
        select = select.masked_fill(~eligible, float("-inf"))
    idx = _descending(select)[:, :k]
    y = norm.gather(1, idx)
    if norm_type == 1:
        y = y / (y.sum(-1, keepdim=True) + eps)
    y = y * routed_scaling_factor
    return y.to(x.dtype), idx.to(torch.int32), norm.float()


def gating_top_k_meta(x, k, *, bias=None, input_ids=None, tid2eid=None, k_group=1,
                      group_count=1, group_select_mode=0, renorm=0, norm_type=0,
                      out_flag=False, routed_scaling_factor=1.0, eps=1e-20):
    _check_gating(x, k, bias, input_ids, tid2eid, k_group, group_count, group_select_mode,
                  renorm, norm_type)
    n = x.shape[0]
    return (x.new_empty((n, k)), x.new_empty((n, k), dtype=torch.int32),
            x.new_empty(tuple(x.shape), dtype=torch.float32))


def gating_top_k_npu(x, k, **kw):
    return torch_npu_module().npu_moe_gating_top_k(x, k, **kw)


@npu_op(GATE_OP)
def npu_moe_gating_top_k(x: torch.Tensor, k: int, *, bias=None, input_ids=None, tid2eid=None,
                         k_group: int = 1, group_count: int = 1, group_select_mode: int = 0,
                         renorm: int = 0, norm_type: int = 0, out_flag: bool = False,
                         routed_scaling_factor: float = 1.0, eps: float = 1e-20):
    impl = GATING_TOP_K.pick(x.device)
    return impl(x, k, bias=bias, input_ids=input_ids, tid2eid=tid2eid, k_group=k_group,
                group_count=group_count, group_select_mode=group_select_mode, renorm=renorm,
                norm_type=norm_type, out_flag=out_flag,
                routed_scaling_factor=routed_scaling_factor, eps=eps)


GATING_TOP_K = NpuOp(GATE_OP, npu=gating_top_k_npu, reference=gating_top_k_reference,
                     meta=gating_top_k_meta, rules="MOE_RULES")


# ---------------------------------------------------------- npu_moe_gating_top_k_softmax
def _check_softmax(x, finished, k) -> None:
    if x.dim() != 2:
        raise NotImplementedError(f"npu_moe_gating_top_k_softmax: only 2-D x is emulated, got "
                                  f"{tuple(x.shape)}")
    if not 0 < k <= min(x.shape[1], MAX_SOFTMAX_K):
        raise ValueError(f"npu_moe_gating_top_k_softmax: k {k} not in (0, {min(x.shape[1], MAX_SOFTMAX_K)}]")
    if finished is not None and (finished.dtype != torch.bool or tuple(finished.shape) != tuple(x.shape[:-1])):
        raise ValueError(f"npu_moe_gating_top_k_softmax: finished must be bool {tuple(x.shape[:-1])}")


def _k_major_rows(n: int, k: int, like: torch.Tensor) -> torch.Tensor:
    return torch.arange(n * k, dtype=torch.int32, device=like.device).view(k, n).t().contiguous()


def gating_top_k_softmax_reference(x, finished=None, k=1):
    _check_softmax(x, finished, k)
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    probs = torch.softmax(x.to(work), -1)
    if x.dtype == torch.float16:
        # CANN's kernel keeps float16 input in half precision through softmax and top-k
        # (bfloat16 is widened to float32 first): experts whose probabilities round to the
        # same half value tie, and the lower expert id wins (op-plugin's CPU golden).
        probs = probs.to(torch.float16)
    idx = _descending(probs)[:, :k]
    y = probs.gather(1, idx).to(x.dtype)
    idx = idx.to(torch.int32)
    if finished is not None:
        idx = idx.masked_fill(finished[:, None], x.shape[1])
    return y, idx, _k_major_rows(x.shape[0], k, x)


def gating_top_k_softmax_meta(x, finished=None, k=1):
    _check_softmax(x, finished, k)
    n = x.shape[0]
    return (x.new_empty((n, k)), x.new_empty((n, k), dtype=torch.int32),
            x.new_empty((n, k), dtype=torch.int32))


def gating_top_k_softmax_npu(x, finished=None, k=1):
    return torch_npu_module().npu_moe_gating_top_k_softmax(x, finished, k=k)


@npu_op(GATE_SOFTMAX_OP)
def npu_moe_gating_top_k_softmax(x: torch.Tensor, finished=None, k: int = 1):
    impl = GATING_TOP_K_SOFTMAX.pick(x.device)
    return impl(x, finished, k=k)


GATING_TOP_K_SOFTMAX = NpuOp(GATE_SOFTMAX_OP, npu=gating_top_k_softmax_npu,
                             reference=gating_top_k_softmax_reference,
                             meta=gating_top_k_softmax_meta, rules="MOE_RULES")
