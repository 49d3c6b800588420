"""MC2 token exchange for expert parallelism: ``torch_npu.npu_moe_distribute_dispatch_v2``
and ``npu_moe_distribute_combine_v2`` (one launch each, the all-to-all-v on the device).

Semantics: torch-npu's operator documentation (op-plugin ``docs/context/
torch_npu-npu_moe_distribute_dispatch_v2.md`` / ``..._combine_v2.md``; the 2.13 wheel's
``_op_plugin_docs.py`` has no page for them) and the wheel's official Meta kernels
(shapes). The documented subset the plugin calls, and the references emulate:

- ``npu_moe_distribute_dispatch_v2(x [BS, H], expert_ids [BS, K] int32, group_ep,
  ep_world_size W, ep_rank_id r, moe_expert_num E, *, global_bs=0,
  expert_token_nums_type=1, ...) -> (expand_x, dynamic_scales, assist_info_for_combine,
  expert_token_nums, ep_recv_counts, tp_recv_counts, expand_scales)``: every (token, k)
  pair's row ``x[t]`` goes to the rank owning expert ``expert_ids[t, k]`` (rank ``e // L``,
  ``L = E / W`` experts per rank; no shared-expert ranks); rank ``r`` receives them in
  ``expand_x [A, H]`` grouped by local expert, then by source rank ("输出顺序固定为
  (local_expert_id, src_rank_id)"), ``expert_token_nums [L]`` int64 the rows per local
  expert (type 1; running sums with type 0), ``A = global_bs * min(L, K)`` (``global_bs
  = BS * W`` when 0; ``max_bs * W`` when the ranks' BS differ, as the documentation asks).
  Rows past the received ones are undefined (NaN here, so a caller that reads them is
  caught). ``assist_info_for_combine`` ``[max(BS*K, A*128)]`` and ``ep_recv_counts``
  ``[W*L]`` (A3) carry what the combine needs; the documentation says their values may
  differ across products and versions and that nothing but the combine may depend on them
  (the reference: per row ``(source rank, token, k)``, and running sums of rows per
  (local expert, source rank)). ``quant_mode`` 0, or 2 ("动态量化"): each token quantized
  to int8 once before it is sent, per token and symmetric as ``npu_dynamic_quant``, the
  rows arriving int8 with their tokens' scales in ``dynamic_scales [A]`` fp32 (NaN past
  the received rows); no smoothing ``scales``. No TP domain
  (``tp_world_size`` 0/1: ``tp_recv_counts`` is empty), no shared-expert ranks, no
  ``x_active_mask`` / ``expert_scales`` / ``elastic_info`` / special experts: refused.
- ``npu_moe_distribute_combine_v2(expand_x [A, H], expert_ids, assist_info_for_combine,
  ep_send_counts, expert_scales [BS, K] fp32, group_ep, W, r, E, *, shared_expert_x=None,
  global_bs=0, ...) -> [BS, H]``: the rows travel back the way they came and
  ``out[t] = sum_k expert_scales[t, k] * row(t, k)`` (plus ``shared_expert_x[t]``), in
  ``expand_x``'s dtype ("相当于按npu_moe_distribute_dispatch_v2算子收集数据的路径原路返回");
  as the owners' CPU golden: accumulated in float32, over k in order (k = 0..K-1),
  rounded once.

``group_ep`` names the EP process group: on an NPU, HCCL's communicator name
(``ProcessGroupHCCL.get_hccl_comm_name``); in the emulation, the name the plugin's
communicator registered its group under (``register_group``). The references exchange the
rows over that ``torch.distributed`` group (gloo in the emulation) with all-gathers: the
same result as the kernel's all-to-all-v, so two emulated ranks compute what two NPUs do.
Both operators are collectives: every rank of the group calls them in the same order, with
the same ``global_bs`` (the documentation: the same on every rank and every layer).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from vllm_ascend_ext.ops._dispatch import torch_npu_module
from vllm_ascend_ext.ops.counting import npu_op
from vllm_ascend_ext.ops.op_record import NpuOp
from vllm_ascend_ext.ops.quant import dynamic_quant_reference

DISPATCH_OP, COMBINE_OP = "npu_moe_distribute_dispatch_v2", "npu_moe_distribute_combine_v2"
ASSIST_ROW = 128          # assist_info_for_combine holds A * 128 entries
_FIELDS = 3               # the reference's per-row record: (source rank, token, k)

_GROUPS: dict[str, object] = {}


def register_group(name: str, group) -> None:
    """Make ``name`` resolve to the ``torch.distributed`` group ``group`` (the emulation's
    stand-in for an HCCL communicator name)."""
    _GROUPS[name] = group


def registered_group(name: str):
    if name not in _GROUPS:
        raise ValueError(f"{DISPATCH_OP}: no process group registered as group_ep {name!r} "
                         "(the plugin's communicator registers its expert-parallel group)")
    return _GROUPS[name]


# ------------------------------------------------------------------------- shared checks
def _unsupported(op: str, **given) -> None:
    named = [k for k, v in given.items() if v not in (None, 0, "", False)]
    if named:
        raise NotImplementedError(f"{op}: {', '.join(named)} not emulated (no TP domain, no "
                                  "shared-expert ranks, no masks, elastic or special experts)")


def _check_common(op: str, expert_ids, ep_world_size, ep_rank_id, moe_expert_num,
                  shared_expert_num, shared_expert_rank_num, tp_world_size) -> int:
    if expert_ids.dim() != 2 or expert_ids.dtype != torch.int32:
        raise ValueError(f"{op}: expert_ids must be [BS, K] int32, got {tuple(expert_ids.shape)} "
                         f"{expert_ids.dtype}")
    if not 0 <= ep_rank_id < ep_world_size:
        raise ValueError(f"{op}: ep_rank_id {ep_rank_id} not in [0, {ep_world_size})")
    if shared_expert_rank_num != 0 or shared_expert_num not in (0, 1):
        raise NotImplementedError(f"{op}: shared-expert ranks are not emulated "
                                  f"(shared_expert_rank_num={shared_expert_rank_num})")
    if tp_world_size not in (0, 1):
        raise NotImplementedError(f"{op}: a TP domain (tp_world_size={tp_world_size}) is not emulated")
    if moe_expert_num <= 0 or moe_expert_num % ep_world_size:
        raise ValueError(f"{op}: moe_expert_num {moe_expert_num} must be a positive multiple of "
                         f"ep_world_size {ep_world_size}")
    return moe_expert_num // ep_world_size


def _sizes(bs: int, k: int, local: int, world: int, global_bs: int) -> tuple[int, int]:
    """(max_bs, A) of a call."""
    if global_bs and global_bs % world:
        raise ValueError(f"global_bs {global_bs} must be max_bs * ep_world_size ({world})")
    max_bs = global_bs // world if global_bs else bs
    if bs > max_bs:
        raise ValueError(f"BS {bs} exceeds global_bs / ep_world_size = {max_bs}")
    return max_bs, max_bs * world * min(local, k)


def _gather(t: torch.Tensor, rows: int, group, fill) -> list[torch.Tensor]:
    """Every rank's ``t`` padded to ``rows`` rows (``fill``), gathered over ``group``."""
    padded = t.new_full((rows, *t.shape[1:]), fill)
    padded[:t.shape[0]] = t
    parts = [torch.empty_like(padded) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, padded.contiguous(), group=group)
    return parts


# ------------------------------------------------------------ npu_moe_distribute_dispatch_v2
def _check_dispatch(x, expert_ids, ep_world_size, ep_rank_id, moe_expert_num, kw) -> int:
    if x.dim() != 2 or x.shape[0] != expert_ids.shape[0]:
        raise ValueError(f"{DISPATCH_OP}: x [BS, H] and expert_ids [BS, K] required, got "
                         f"{tuple(x.shape)} and {tuple(expert_ids.shape)}")
    if kw["quant_mode"] not in (0, 2):
        raise NotImplementedError(f"{DISPATCH_OP}: quant_mode {kw['quant_mode']} not emulated "
                                  "(0, or 2: dynamic per-token int8)")
    if kw["expert_token_nums_type"] not in (0, 1):
        raise ValueError(f"{DISPATCH_OP}: expert_token_nums_type must be 0 or 1")
    _unsupported(DISPATCH_OP, scales=kw["scales"], x_active_mask=kw["x_active_mask"],
                 expert_scales=kw["expert_scales"], elastic_info=kw["elastic_info"],
                 performance_info=kw["performance_info"], group_tp=kw["group_tp"],
                 zero_expert_num=kw["zero_expert_num"], copy_expert_num=kw["copy_expert_num"],
                 const_expert_num=kw["const_expert_num"], expert_shard_type=kw["expert_shard_type"],
                 y_dtype=kw["y_dtype"])
    return _check_common(DISPATCH_OP, expert_ids, ep_world_size, ep_rank_id, moe_expert_num,
                         kw["shared_expert_num"], kw["shared_expert_rank_num"], kw["tp_world_size"])


_DISPATCH_DEFAULTS = dict(scales=None, x_active_mask=None, expert_scales=None, elastic_info=None,
                          performance_info=None, group_tp="", tp_world_size=0, tp_rank_id=0,
                          expert_shard_type=0, shared_expert_num=1, shared_expert_rank_num=0,
                          quant_mode=0, global_bs=0, expert_token_nums_type=1, comm_alg="",
                          zero_expert_num=0, copy_expert_num=0, const_expert_num=0,
                          y_dtype=None, x_dtype=None, scales_dtype=None)


def dispatch_v2_reference(x, expert_ids, group_ep, ep_world_size, ep_rank_id, moe_expert_num,
                          **kwargs):
    kw = {**_DISPATCH_DEFAULTS, **kwargs}
    local = _check_dispatch(x, expert_ids, ep_world_size, ep_rank_id, moe_expert_num, kw)
    bs, k = expert_ids.shape
    max_bs, a = _sizes(bs, k, local, ep_world_size, kw["global_bs"])
    group = registered_group(group_ep)
    if dist.get_world_size(group) != ep_world_size or dist.get_rank(group) != ep_rank_id:
        raise ValueError(f"{DISPATCH_OP}: group {group_ep!r} has {dist.get_world_size(group)} "
                         f"ranks (this one {dist.get_rank(group)}); the call says "
                         f"ep_world_size={ep_world_size}, ep_rank_id={ep_rank_id}")
    quantized = kw["quant_mode"] == 2
    if quantized:      # each token quantized once, before it is sent: int8 and its scale
        x, token_scale = dynamic_quant_reference(x)
        scale_parts = _gather(token_scale, max_bs, group, float("nan"))
    xs = _gather(x, max_bs, group, 0)
    ids = _gather(expert_ids, max_bs, group, -1)
    first = ep_rank_id * local
    rows, scales, info = [], [], []
    per_pair = torch.zeros(local, ep_world_size, dtype=torch.int64)
    for e in range(local):                                  # (local expert, source rank)
        for src in range(ep_world_size):
            token, kk = torch.nonzero(ids[src] == first + e, as_tuple=True)
            rows.append(xs[src][token])
            if quantized:
                scales.append(scale_parts[src][token])
            info.append(torch.stack([torch.full_like(token, src), token, kk], 1))
            per_pair[e, src] = token.numel()
    received = torch.cat(rows)
    fill = float("nan") if x.dtype.is_floating_point else 0
    expand_x = x.new_full((a, x.shape[1]), fill)
    expand_x[:received.shape[0]] = received
    dynamic_scales = torch.full((a,), float("nan") if quantized else 0.0, dtype=torch.float32,
                                device=x.device)
    if quantized:
        dynamic_scales[:received.shape[0]] = torch.cat(scales)
    assist = torch.full((max(bs * k, a * ASSIST_ROW),), -1, dtype=torch.int32, device=x.device)
    flat = torch.cat(info).reshape(-1).to(torch.int32)
    assist[:flat.numel()] = flat
    counts = per_pair.sum(1)
    if kw["expert_token_nums_type"] == 0:
        counts = counts.cumsum(0)
    ep_recv_counts = per_pair.reshape(-1).cumsum(0).to(torch.int32)
    return (expand_x, dynamic_scales, assist,
            counts.to(device=x.device), ep_recv_counts.to(device=x.device),
            torch.empty(kw["tp_world_size"], dtype=torch.int32, device=x.device),
            torch.empty(0, dtype=torch.float32, device=x.device))


def dispatch_v2_meta(x, expert_ids, group_ep, ep_world_size, ep_rank_id, moe_expert_num,
                     **kwargs):
    kw = {**_DISPATCH_DEFAULTS, **kwargs}
    local = _check_dispatch(x, expert_ids, ep_world_size, ep_rank_id, moe_expert_num, kw)
    bs, k = expert_ids.shape
    _, a = _sizes(bs, k, local, ep_world_size, kw["global_bs"])
    rows_dtype = torch.int8 if kw["quant_mode"] == 2 else x.dtype
    return (x.new_empty((a, x.shape[1]), dtype=rows_dtype),
            x.new_empty((a,), dtype=torch.float32),
            x.new_empty((max(bs * k, a * ASSIST_ROW),), dtype=torch.int32),
            x.new_empty((local,), dtype=torch.int64),
            x.new_empty((ep_world_size * local,), dtype=torch.int32),
            x.new_empty((kw["tp_world_size"],), dtype=torch.int32),
            x.new_empty((0,), dtype=torch.float32))


def dispatch_v2_npu(x, expert_ids, group_ep, ep_world_size, ep_rank_id, moe_expert_num, **kwargs):
    return torch_npu_module().npu_moe_distribute_dispatch_v2(
        x, expert_ids, group_ep, ep_world_size, ep_rank_id, moe_expert_num, **kwargs)


@npu_op(DISPATCH_OP)
def npu_moe_distribute_dispatch_v2(x: torch.Tensor, expert_ids: torch.Tensor, group_ep: str,
                                   ep_world_size: int, ep_rank_id: int, moe_expert_num: int,
                                   **kwargs):
    impl = DISPATCH_V2.pick(x.device)
    return impl(x, expert_ids, group_ep, ep_world_size, ep_rank_id, moe_expert_num, **kwargs)


DISPATCH_V2 = NpuOp(DISPATCH_OP, npu=dispatch_v2_npu, reference=dispatch_v2_reference,
                    meta=dispatch_v2_meta, rules="MC2_RULES")


# ------------------------------------------------------------- npu_moe_distribute_combine_v2
_COMBINE_DEFAULTS = dict(tp_send_counts=None, x_active_mask=None, expand_scales=None,
                         shared_expert_x=None, elastic_info=None, ori_x=None,
                         const_expert_alpha_1=None, const_expert_alpha_2=None,
                         const_expert_v=None, performance_info=None, group_tp="",
                         tp_world_size=0, tp_rank_id=0, expert_shard_type=0, shared_expert_num=1,
                         shared_expert_rank_num=0, global_bs=0, comm_quant_mode=0, comm_alg="",
                         zero_expert_num=0, copy_expert_num=0, const_expert_num=0)


def _check_combine(expand_x, expert_ids, expert_scales, ep_world_size, ep_rank_id,
                   moe_expert_num, kw) -> int:
    tp_counts = kw["tp_send_counts"]
    _unsupported(COMBINE_OP, x_active_mask=kw["x_active_mask"], expand_scales=kw["expand_scales"],
                 elastic_info=kw["elastic_info"], ori_x=kw["ori_x"],
                 const_expert_alpha_1=kw["const_expert_alpha_1"],
                 const_expert_alpha_2=kw["const_expert_alpha_2"],
                 const_expert_v=kw["const_expert_v"], performance_info=kw["performance_info"],
                 group_tp=kw["group_tp"], comm_quant_mode=kw["comm_quant_mode"],
                 zero_expert_num=kw["zero_expert_num"], copy_expert_num=kw["copy_expert_num"],
                 const_expert_num=kw["const_expert_num"], expert_shard_type=kw["expert_shard_type"],
                 tp_send_counts=None if tp_counts is None or tp_counts.numel() == 0 else tp_counts)
    local = _check_common(COMBINE_OP, expert_ids, ep_world_size, ep_rank_id, moe_expert_num,
                          kw["shared_expert_num"], kw["shared_expert_rank_num"], kw["tp_world_size"])
    if expand_x.dim() != 2:
        raise ValueError(f"{COMBINE_OP}: expand_x must be [A, H], got {tuple(expand_x.shape)}")
    if expert_scales is None or tuple(expert_scales.shape) != tuple(expert_ids.shape):
        raise ValueError(f"{COMBINE_OP}: expert_scales must be [BS, K] = {tuple(expert_ids.shape)}")
    shared = kw["shared_expert_x"]
    if shared is not None and shared.reshape(-1, shared.shape[-1]).shape != (
            expert_ids.shape[0], expand_x.shape[1]):
        raise ValueError(f"{COMBINE_OP}: shared_expert_x {tuple(shared.shape)} must hold "
                         f"[BS, H] = [{expert_ids.shape[0]}, {expand_x.shape[1]}]")
    return local


def combine_v2_reference(expand_x, expert_ids, assist_info_for_combine, ep_send_counts,
                         expert_scales, group_ep, ep_world_size, ep_rank_id, moe_expert_num,
                         **kwargs):
    kw = {**_COMBINE_DEFAULTS, **kwargs}
    local = _check_combine(expand_x, expert_ids, expert_scales, ep_world_size, ep_rank_id,
                           moe_expert_num, kw)
    bs, k = expert_ids.shape
    _, a = _sizes(bs, k, local, ep_world_size, kw["global_bs"])
    if expand_x.shape[0] < a:
        raise ValueError(f"{COMBINE_OP}: expand_x has {expand_x.shape[0]} rows, fewer than A = {a}")
    group = registered_group(group_ep)
    valid = int(ep_send_counts[-1])                       # rows this rank received
    info = assist_info_for_combine[:valid * _FIELDS].reshape(valid, _FIELDS).long()
    rows = _gather(expand_x[:valid], a, group, 0)
    infos = _gather(info, a, group, -1)
    # The owners' golden (op-plugin ``test_moe_distribute_combine_v2.py``): each row in
    # float32 times its fp32 scale, summed over k in expert_ids' column order (k = 0..K-1,
    # not the order the rows come back in), the shared expert added, then one rounding.
    work = torch.float64 if expand_x.dtype == torch.float64 else torch.float32
    weighted = torch.zeros(bs, k, expand_x.shape[1], dtype=work, device=expand_x.device)
    scales = expert_scales.to(work)
    for owner_rows, owner_info in zip(rows, infos):
        mine = owner_info[:, 0] == ep_rank_id
        token, kk = owner_info[mine, 1], owner_info[mine, 2]
        weighted[token, kk] = owner_rows[mine].to(work) * scales[token, kk][:, None]
    out = torch.zeros(bs, expand_x.shape[1], dtype=work, device=expand_x.device)
    for j in range(k):
        out += weighted[:, j]
    shared = kw["shared_expert_x"]
    if shared is not None:
        out += shared.reshape(bs, -1).to(work)
    return out.to(expand_x.dtype)


def combine_v2_meta(expand_x, expert_ids, assist_info_for_combine, ep_send_counts, expert_scales,
                    group_ep, ep_world_size, ep_rank_id, moe_expert_num, **kwargs):
    kw = {**_COMBINE_DEFAULTS, **kwargs}
    _check_combine(expand_x, expert_ids, expert_scales, ep_world_size, ep_rank_id,
                   moe_expert_num, kw)
    return expand_x.new_empty((expert_ids.shape[0], expand_x.shape[1]))


def combine_v2_npu(expand_x, expert_ids, assist_info_for_combine, ep_send_counts, expert_scales,
                   group_ep, ep_world_size, ep_rank_id, moe_expert_num, **kwargs):
    return torch_npu_module().npu_moe_distribute_combine_v2(
        expand_x, expert_ids, assist_info_for_combine, ep_send_counts, expert_scales, group_ep,
        ep_world_size, ep_rank_id, moe_expert_num, **kwargs)


@npu_op(COMBINE_OP)
def npu_moe_distribute_combine_v2(expand_x: torch.Tensor, expert_ids: torch.Tensor,
                                  assist_info_for_combine: torch.Tensor,
                                  ep_send_counts: torch.Tensor, expert_scales: torch.Tensor,
                                  group_ep: str, ep_world_size: int, ep_rank_id: int,
                                  moe_expert_num: int, **kwargs):
    impl = COMBINE_V2.pick(expand_x.device)
    return impl(expand_x, expert_ids, assist_info_for_combine, ep_send_counts, expert_scales,
                group_ep, ep_world_size, ep_rank_id, moe_expert_num, **kwargs)


COMBINE_V2 = NpuOp(COMBINE_OP, npu=combine_v2_npu, reference=combine_v2_reference,
                   meta=combine_v2_meta, rules="MC2_RULES")
