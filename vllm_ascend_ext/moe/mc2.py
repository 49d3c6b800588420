"""The MC2 token dispatcher: expert parallelism under data parallelism in two collective
launches, ``npu_moe_distribute_dispatch_v2`` / ``npu_moe_distribute_combine_v2``
(``ops/moe_distribute.py``), instead of vLLM's all-gather of every rank's tokens and
reduce-scatter of every rank's partial outputs.

Per MoE layer and step, after routing: the dispatch sends each (token, k) pair's row to
the rank owning its expert and returns the rows this rank received, grouped by local
expert, with their running counts; the layer's experts run over them (``ffn``: two
``npu_grouped_matmul`` and ``npu_swiglu``, or their W8A8 forms, ``experts.grouped_ffn*``;
the groups end before the buffer's ``A`` rows: the departure ``groups_may_end_early``
allows, and the rows past them are never read: the combine takes only the rows the
dispatch filled); the combine sends the rows back and sums each token's ``k`` rows
weighted by its routing weights. The output is the token's whole routed-expert sum:
vLLM's runner then skips its own exchange for this layer (``supports_internal_mk``) and
adds the shared experts. No host read: the buffers' sizes come from ``global_bs``, a
constant of the engine. For W8A8 experts the dispatch quantizes each token to int8 once,
per token, before sending it (``quant_mode`` 2: half the bytes on the wire, the scales
beside the rows), as the layer's routing does on one rank.

The gate (``mc2_plan``, pure, decided once per layer when its weights are loaded, so every
rank takes the same route; the operators are collectives) takes MC2 when:
``ascend_ext.moe_dispatch`` is not ``allgather``; vLLM runs an expert-parallel exchange
for the layer (DP > 1 or sequence-parallel MoE, with ``--enable-expert-parallel``); each
EP rank holds tokens of its own (TP 1, or the MoE runs sequence-parallel: with TP > 1 and
replicated tokens vLLM all-reduces the layer's output over TP, which would add every
rank's complete MC2 result); the experts are placed linearly (rank ``r`` holds experts
``[r*L, (r+1)*L)``, the placement the operators assume); the activations are bf16/fp16;
and every documented bound (``ops/moe_distribute_bounds.py``) holds for the layer's sizes.

**Step size.** The operators take at most 512 tokens per rank on A3 (256 on A2), fewer
than a prefill step brings, and their HCCL buffer grows with the tokens they are sized for
(``moe/hccl_buffer.py``). The plan sizes the buffers for a decode step, as vllm-ascend does:
``min(capacity, decode_tokens, that bound)`` tokens per rank (``capacity``: the most tokens
a rank can bring to a MoE layer in one step, ``max_num_batched_tokens``; ``decode_tokens``:
a decode step's, ``max_num_seqs * (1 + k)`` with ``k`` speculative tokens; each split over
the TP ranks when the MoE runs sequence-parallel). When ``capacity`` is larger the plan is
*step-sized*: each step the
layer compares the most tokens any EP rank brings to it (vLLM's per-rank sizes of the
step, host integers every rank holds alike) with the plan's, and a larger step takes the
other exchange (``moe/step_route.py``): decode-sized steps go through MC2, prefill-sized
ones through all-gather, or all-to-all where it is asked for (eager steps only).
``moe_dispatch: "mc2"`` turns a declined gate into an error at model load naming the
reasons.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vllm_ascend_ext.errors import AscendExtError
from vllm_ascend_ext.ops.moe_distribute import (
    npu_moe_distribute_combine_v2,
    npu_moe_distribute_dispatch_v2,
)
from vllm_ascend_ext.ops.moe_distribute_bounds import max_tokens, outside

HALF = (torch.bfloat16, torch.float16)


class Mc2Refused(AscendExtError):
    """``ascend_ext.moe_dispatch: "mc2"`` where MC2 cannot run; the message says why."""


@dataclass(frozen=True)
class Mc2Facts:
    """What the gate decides on: host values only (configuration and layer sizes)."""

    setting: str               # ascend_ext.moe_dispatch
    family: str                # SoC family: A2, A3, A5
    exchange: bool             # vLLM runs an EP token exchange for the layer
    linear: bool               # rank r holds experts [r*L, (r+1)*L)
    dtype: torch.dtype
    hidden: int
    top_k: int
    experts: int
    ep_world_size: int
    ep_rank: int
    capacity: int              # most tokens of one rank in one step
    replicated: bool = False   # TP ranks hold the same tokens (TP > 1, MoE not seq-parallel)
    decode_tokens: int | None = None  # most tokens of one rank in a decode step (None: capacity)
    hccl_tokens: int | None = None    # most tokens per rank HCCL_BUFFSIZE holds (None: no limit)


@dataclass(frozen=True)
class Mc2Plan:
    """The constant arguments of a layer's dispatch and combine."""

    group: str                 # group_ep: the EP group's communicator name
    world: int
    rank: int
    experts: int
    global_bs: int             # tokens * world: every rank's buffers the same size
    every_step: bool = True    # False: step-sized, larger steps take another exchange

    @property
    def local(self) -> int:
        return self.experts // self.world

    @property
    def tokens(self) -> int:
        """The most tokens per rank a step may bring to take MC2."""
        return self.global_bs // self.world


def declined(f: Mc2Facts) -> list[str]:
    """Why the MC2 route does not apply (empty: it does)."""
    if f.setting == "allgather":
        return ["ascend_ext.moe_dispatch is 'allgather'"]
    if not f.exchange:
        return ["no expert-parallel token exchange for this layer (MC2 needs "
                "--enable-expert-parallel with data parallelism or sequence-parallel MoE)"]
    why = []
    if f.replicated:
        why.append("the TP ranks hold the same tokens and this layer does not split them (TP > "
                   "1 without sequence-parallel MoE: a block that reduces the layer's output "
                   "itself, or prefill context parallelism): each would dispatch them")
    if not f.linear:
        why.append("experts not placed linearly (MC2 assumes rank r holds [r*L, (r+1)*L))")
    if f.dtype not in HALF:
        why.append(f"activations in {str(f.dtype).removeprefix('torch.')}; the operators "
                   "take bfloat16 / float16")
    if f.hccl_tokens == 0 and f.setting != "mc2":
        why.append("HCCL_BUFFSIZE holds no MC2 buffer for this layer's sizes "
                   "(moe/hccl_buffer.py)")
        return why
    why += outside(f.family, hidden=f.hidden, bs=buffer_tokens(f), top_k=f.top_k,
                   experts=f.experts, ep_world_size=f.ep_world_size)
    return why


def buffer_tokens(f: Mc2Facts) -> int:
    """The tokens per rank MC2's buffers are sized for: a decode step's (at most the
    layer's ``capacity``), at most the operators' documented bound on the SoC (larger steps
    take another exchange)."""
    tokens = f.capacity if f.decode_tokens is None else min(f.capacity, f.decode_tokens)
    bound = max_tokens(f.family)
    tokens = tokens if bound is None else min(tokens, bound)
    if f.hccl_tokens is not None and f.setting != "mc2":  # "mc2" refuses a small buffer
        tokens = min(tokens, f.hccl_tokens)
    return tokens


def decode_tokens(scheduler_config, speculative_config, split: int = 1,
                  capture_sizes=()) -> int:
    """The most tokens one rank brings to a MoE layer in a decode step: ``max_num_seqs``
    requests of ``1 + k`` tokens (``k`` speculative tokens), padded to the decode graph's
    capture size that holds them (a replayed step brings the padded count), split over
    ``split`` TP ranks."""
    k = int(getattr(speculative_config, "num_speculative_tokens", 0) or 0)
    tokens = int(scheduler_config.max_num_seqs) * (1 + k)
    tokens = min((c for c in capture_sizes if c >= tokens), default=tokens)
    return -(-tokens // max(split, 1))


def with_hccl_limit(f: Mc2Facts, environ) -> Mc2Facts:
    """``f`` with the most tokens per rank the configured ``HCCL_BUFFSIZE`` holds
    (``moe/hccl_buffer.py``), where the operators are documented."""
    from dataclasses import replace

    from vllm_ascend_ext.moe.hccl_buffer import tokens_that_fit

    if max_tokens(f.family) is None or not f.ep_world_size or not f.exchange:
        return f
    limit = buffer_tokens(replace(f, hccl_tokens=None))
    return replace(f, hccl_tokens=tokens_that_fit(
        f.family, hidden=f.hidden, top_k=f.top_k, experts=f.experts,
        ep_world=f.ep_world_size, upto=limit, x_bytes=f.dtype.itemsize, environ=environ))


def mc2_plan(f: Mc2Facts, group_name) -> Mc2Plan | None:
    """The layer's MC2 plan, ``None`` for the all-gather exchange; ``group_name()`` is
    asked only when MC2 applies. Raises ``Mc2Refused`` when ``f.setting`` is ``"mc2"``
    and MC2 does not apply."""
    why = declined(f)
    if why and f.setting == "mc2":
        raise Mc2Refused("ascend_ext.moe_dispatch is 'mc2' but MC2 cannot run here: "
                         + "; ".join(why) + " (use 'auto' or 'allgather')")
    if why:
        return None
    tokens = buffer_tokens(f)
    return Mc2Plan(group_name(), f.ep_world_size, f.ep_rank, f.experts,
                   tokens * f.ep_world_size, every_step=tokens >= f.capacity)


def routed_experts_mc2(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                       ffn: Callable[..., torch.Tensor], plan: Mc2Plan,
                       int8_rows: bool = False) -> torch.Tensor:
    """``sum_k weights[t, k] * FFN_{ids[t, k]}(x[t])`` over every rank's experts, for this
    rank's tokens ``x [T, H]`` (at most ``plan.tokens``). ``ffn(rows, row_scales, ends,
    out_dtype)`` computes this rank's ``L`` experts over rows grouped by expert, expert
    ``j`` over rows ``[ends[j-1], ends[j])`` (``experts.grouped_ffn*``); ``int8_rows``: the
    dispatch quantizes each token per row first (``quant_mode`` 2, W8A8 experts)."""
    common = dict(group_ep=plan.group, ep_world_size=plan.world, ep_rank_id=plan.rank,
                  moe_expert_num=plan.experts, global_bs=plan.global_bs)
    rows, row_scales, assist, ends, recv_counts, tp_counts, _ = npu_moe_distribute_dispatch_v2(
        x, ids, expert_token_nums_type=0, quant_mode=2 if int8_rows else 0, **common)
    down = ffn(rows, row_scales if int8_rows else None, ends, x.dtype)
    return npu_moe_distribute_combine_v2(down, ids, assist, recv_counts, weights.float(),
                                         tp_send_counts=tp_counts, **common)
