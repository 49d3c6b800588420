"""The all-to-all token dispatcher: expert parallelism under data parallelism with each
(token, k) row sent only to the rank owning its expert, over HCCL's AlltoAllV
(``all_to_all_single`` with per-rank sizes, ``AscendCommunicator.all_to_all_v``), instead
of vLLM's all-gather of every rank's tokens and reduce-scatter of every rank's partial
outputs. Opt-in: ``ascend_ext.moe_dispatch: "alltoall"``.

**Its one host read.** AlltoAllV takes its per-rank sizes as host integers (HCCL's
``HcclAlltoAllV``, ``torch.distributed.all_to_all_single``; the device-tensor count
arguments of torch_npu's fused ``npu_alltoallv_gmm`` are documented as not supported yet).
The sizes depend on this step's routing, so each MoE layer reads ``2 * W`` integers back
from the device once per step (``counting.host_read``: the op counter counts it). That
breaks the plugin's rule of no host sync in the per-step hot path, which is why the
dispatcher is never chosen by ``auto``: a user who takes it trades one sync per layer for
moving each row only where its expert is (vllm-ascend's A3 choice for prefill-sized
steps; ``benchmarks/moe_exchange_bytes.py``). It cannot run inside a captured graph (the
sizes must be known when the call is issued): a step captured into a decode graph takes
MC2 or the all-gather instead (``moe/step_route.py``), so only eager steps read.

Per MoE layer and step, after routing (``experts.route``):

1. ``npu_moe_init_routing_v2`` over the global experts renumbered rank-major (owner rank,
   then local slot; the identity for vLLM's linear placement, one gather for round robin):
   the rows sorted by destination rank and expert, the rows per expert;
2. an all-to-all of those counts (fixed sizes: each rank's experts), so every rank knows
   how many rows of each of its experts come from each source; the one host read of the
   rows to send to and receive from each rank;
3. AlltoAllV of the rows; this rank's experts over the rows it received, with the
   layer's own single-rank route (float or W8A8, ``experts.py``) taking each row's local
   expert as a top-1 choice with no weight (``npu_moe_init_routing_v2``, grouped matmuls
   that cover every received row exactly, ``npu_moe_token_unpermute`` back to arrival
   order);
4. AlltoAllV of the results back the way they came; ``npu_moe_token_unpermute`` sums each
   token's ``k`` rows with its routing weights (fp32, once, as on one rank).

The result is the token's whole routed-expert sum, so vLLM's runner skips its own
exchange for the layer (``supports_internal_mk``) and adds the shared experts. The gate
(``alltoall_plan``) takes the route only when asked, for a layer vLLM runs an EP exchange
for, whose EP ranks hold tokens of their own (TP 1 or sequence-parallel MoE; as for MC2,
replicated TP ranks would each send the same tokens). Any placement, dtype or expert
quantization: the rows travel in the activations' dtype and the local route quantizes
them as it does on one rank.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vllm_ascend_ext.errors import AscendExtError
from vllm_ascend_ext.moe.mc2 import Mc2Facts
from vllm_ascend_ext.ops.counting import host_read
from vllm_ascend_ext.ops.moe_dispatch import npu_moe_init_routing_v2, npu_moe_token_unpermute

SETTING = "alltoall"


class AllToAllRefused(AscendExtError):
    """``ascend_ext.moe_dispatch: "alltoall"`` where the dispatcher cannot run."""


def declined(f: Mc2Facts) -> list[str]:
    """Why the all-to-all route does not apply to a layer (empty: it does)."""
    if f.setting != SETTING:
        return [f"ascend_ext.moe_dispatch is {f.setting!r}, not {SETTING!r}"]
    if not f.exchange:
        return ["no expert-parallel token exchange for this layer (all-to-all needs "
                "--enable-expert-parallel with data parallelism or sequence-parallel MoE)"]
    if f.replicated:
        return ["the TP ranks hold the same tokens and this layer does not split them (TP > "
                "1 without sequence-parallel MoE: a block that reduces the layer's output "
                "itself, or prefill context parallelism): each would send them"]
    return []


@dataclass(frozen=True)
class Placement:
    """Where every global expert lives, from every EP rank's expert map (host)."""

    sizes: tuple[int, ...]            # experts per rank, in rank order
    order: torch.Tensor | None        # [E] int32: global id -> rank-major id; None: identity


def placement(maps: list[torch.Tensor]) -> Placement:
    """``maps[r]``: rank ``r``'s vLLM expert map (global id -> local slot, ``-1``
    elsewhere). Every expert must be on exactly one rank, each rank's slots ``0..L-1``."""
    table = torch.stack([m.to("cpu", torch.int64) for m in maps])      # [W, E]
    owners = (table >= 0).sum(0)
    if not bool((owners == 1).all()):
        bad = torch.nonzero(owners != 1).flatten().tolist()
        raise AllToAllRefused(f"all-to-all dispatch: experts {bad[:8]} are placed on "
                              f"{owners[bad[:8]].tolist()} ranks; each must be on one")
    sizes = tuple(int(n) for n in (table >= 0).sum(1))
    offsets = torch.tensor((0, *sizes[:-1])).cumsum(0)
    owner = (table >= 0).int().argmax(0)
    slot = table.gather(0, owner[None]).squeeze(0)
    for r, n in enumerate(sizes):
        if sorted(slot[owner == r].tolist()) != list(range(n)):
            raise AllToAllRefused(f"all-to-all dispatch: rank {r}'s expert map does not "
                                  f"place its {n} experts on slots 0..{n - 1}")
    order = offsets[owner] + slot
    identity = torch.equal(order, torch.arange(order.numel()))
    return Placement(sizes, None if identity else order.to(torch.int32))


@dataclass(frozen=True)
class AllToAllPlan:
    """The constants of a layer's exchange (built when the layer is, on its device)."""

    rank: int
    sizes: tuple[int, ...]            # experts per rank
    order: torch.Tensor | None        # [E] int32 rank-major renumbering, None: identity
    slots: torch.Tensor               # [W * L] int32: the local expert of each received count
    last: torch.Tensor                # [W] int64: each rank's last rank-major expert id
    comm: object                      # .all_to_all_v(rows, out_splits, in_splits)

    @property
    def world(self) -> int:
        return len(self.sizes)

    @property
    def local(self) -> int:
        return self.sizes[self.rank]

    def to(self, device) -> AllToAllPlan:
        order = None if self.order is None else self.order.to(device)
        return AllToAllPlan(self.rank, self.sizes, order, self.slots.to(device),
                            self.last.to(device), self.comm)


def alltoall_plan(f: Mc2Facts, maps: Callable[[], list[torch.Tensor]],
                  comm: Callable[[], object]) -> AllToAllPlan | None:
    """The layer's all-to-all plan; ``None`` when ``moe_dispatch`` is not ``"alltoall"``;
    ``AllToAllRefused`` naming the reason when it is and the route cannot run.
    ``maps()`` (every EP rank's expert map) and ``comm()`` (the EP group's communicator)
    are asked only when the route applies."""
    if f.setting != SETTING:
        return None
    why = declined(f)
    if why:
        raise AllToAllRefused(f"ascend_ext.moe_dispatch is {SETTING!r} but all-to-all cannot "
                              "run here: " + "; ".join(why) + " (use 'auto' or 'allgather')")
    where = placement(maps())
    if len(where.sizes) != f.ep_world_size:
        raise AllToAllRefused(f"all-to-all dispatch: {len(where.sizes)} expert maps for "
                              f"{f.ep_world_size} EP ranks")
    local = where.sizes[f.ep_rank]
    slots = torch.arange(local, dtype=torch.int32).repeat(f.ep_world_size)
    last = torch.tensor(where.sizes).cumsum(0) - 1
    return AllToAllPlan(f.ep_rank, where.sizes, where.order, slots, last, comm())


def routed_experts_alltoall(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                            plan: AllToAllPlan,
                            local_experts: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                            ) -> torch.Tensor:
    """``sum_k weights[t, k] * FFN_{ids[t, k]}(x[t])`` over every rank's experts for this
    rank's tokens ``x [T, H]``; ``local_experts(rows [R, H], slots [R, 1] int32)`` computes
    this rank's experts, row ``i`` by its expert ``slots[i]``, in row order."""
    world, local = plan.world, plan.local
    experts = sum(plan.sizes)
    dest = ids if plan.order is None else plan.order[ids.long()]
    rows, row_idx, counts, _ = npu_moe_init_routing_v2(
        x, dest, active_num=-1, expert_num=experts, drop_pad_mode=0, expert_tokens_num_type=1,
        expert_tokens_num_flag=True, quant_mode=-1, active_expert_range=(0, experts),
        row_idx_type=0)
    counts = counts.to(torch.int64)
    arriving = plan.comm.all_to_all_v(counts, [local] * world, list(plan.sizes))    # [W * L]
    ends_and_arrivals = torch.cat([counts.cumsum(0)[plan.last],
                                   arriving.view(world, local).sum(1)])
    sizes = host_read(ends_and_arrivals)             # the dispatcher's one host read
    ends, receive = sizes[:world], sizes[world:]
    send = [e - b for b, e in zip([0, *ends[:-1]], ends)]
    arrived = plan.comm.all_to_all_v(rows, receive, send)
    total = sum(receive)
    if total:
        slot = torch.repeat_interleave(plan.slots, arriving, output_size=total)
        done = local_experts(arrived, slot[:, None])
    else:
        done = arrived.new_empty((0, x.shape[1]), dtype=x.dtype)
    back = plan.comm.all_to_all_v(done, send, receive)
    return npu_moe_token_unpermute(back, row_idx, probs=weights)
