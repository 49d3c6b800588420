"""Which experts a rank computes under expert parallelism, as ``npu_moe_init_routing_v2``
arguments (pure, decided once per layer when it is built).

vLLM's MoE layer carries an ``expert_map`` when expert parallelism is on: a
``[global_num_experts]`` int32 tensor holding each global expert's local slot on this rank,
``-1`` for experts other ranks own (``expert_map_manager.determine_expert_map``). The
rank's weights hold only its ``local_num_experts`` experts, in slot order. Routing stays
global (top-k over every expert); only the permutation and the grouped matmuls change:

- **no map** (no EP): every expert, ``active_expert_range = [0, E)``;
- **a contiguous block** (vLLM's ``linear`` placement, the default): the global ids are
  kept and the routing operator drops the others itself, ``active_expert_range =
  [start, start + L)`` (documented: only ids in the range are expanded and counted, the
  counts are per expert of the range): no extra call;
- **any other placement** (``round_robin``): one gather per layer maps the global ids to
  local slots, the foreign experts to slot ``L`` (one past the range), and the routing
  takes ``expert_num = L + 1``, ``active_expert_range = [0, L)``. The map has no ``-1``
  left: the range must hold values >= 0 (the documentation's requirement on the range).

Tokens routed to other ranks' experts contribute nothing here; vLLM sums the ranks'
partial outputs (its all-reduce, or the DP combine) as for its own EP kernels. Their pairs
keep a ``-1`` in the permutation's gather index; the routing weights of those pairs are
zeroed (``masked_weights``: one gather and one multiply) before ``npu_moe_token_unpermute``,
as vllm-ascend's all-gather dispatcher does, so whatever the kernel reads for them adds 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_ascend_ext.moe.routing import UnsupportedMoEError


@dataclass(frozen=True)
class ExpertShard:
    global_experts: int
    local_experts: int
    start: int = 0                        # first global id of a contiguous block
    remap: torch.Tensor | None = None     # [E] int32 global id -> local slot, L if foreign
    owned: torch.Tensor | None = None     # [E] float32, 1 for this rank's experts (sharded)

    @property
    def expert_num(self) -> int:
        """``npu_moe_init_routing_v2``'s ``expert_num``: the id space the ids live in."""
        return self.global_experts if self.remap is None else self.local_experts + 1

    @property
    def active_range(self) -> tuple[int, int]:
        begin = self.start if self.remap is None else 0
        return begin, begin + self.local_experts

    @property
    def is_sharded(self) -> bool:
        return self.local_experts != self.global_experts

    def local_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """The ids the routing operator takes (int32): unchanged for a block."""
        if self.remap is None:
            return ids
        return self.remap[ids]

    def masked_weights(self, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The routing weights with the pairs of other ranks' experts zeroed."""
        if self.owned is None:
            return weights
        return weights * self.owned[ids]

    def to(self, device) -> ExpertShard:
        def move(t):
            return None if t is None else t.to(device)
        return ExpertShard(self.global_experts, self.local_experts, self.start,
                           move(self.remap), move(self.owned))

    def describe(self) -> str:
        if not self.is_sharded:
            return f"all {self.global_experts} experts"
        if self.remap is None:
            return (f"experts [{self.start}, {self.start + self.local_experts}) of "
                    f"{self.global_experts}")
        return f"{self.local_experts} of {self.global_experts} experts (remapped)"


def expert_shard(layer_name: str, expert_map: torch.Tensor | None, global_experts: int,
                 local_experts: int) -> ExpertShard:
    """The shard a layer with ``expert_map`` (vLLM's, or ``None``) computes; a map that is
    not a one-to-one placement of ``local_experts`` slots is refused, naming the layer."""
    if expert_map is None:
        if local_experts != global_experts:
            raise UnsupportedMoEError(f"{layer_name}: {local_experts} local of {global_experts} "
                                      "experts without an expert map")
        return ExpertShard(global_experts, local_experts)
    emap = expert_map.detach().to("cpu", torch.int64)
    if tuple(emap.shape) != (global_experts,):
        raise UnsupportedMoEError(f"{layer_name}: expert map of shape {tuple(emap.shape)}, "
                                  f"expected [{global_experts}] (fused shared experts or an "
                                  "expert mask are not supported)")
    owned = torch.nonzero(emap >= 0).flatten()
    slots = emap[owned]
    if owned.numel() != local_experts or not torch.equal(
            torch.sort(slots).values, torch.arange(local_experts)):
        raise UnsupportedMoEError(f"{layer_name}: the expert map places {owned.numel()} experts "
                                  f"on slots {slots.tolist()}; expected each of the "
                                  f"{local_experts} local slots once")
    if local_experts == 0:
        raise UnsupportedMoEError(f"{layer_name}: this rank owns no expert (more EP ranks than "
                                  f"the {global_experts} experts)")
    start = int(owned[0])
    mask = (emap >= 0).float()
    if torch.equal(owned, torch.arange(start, start + local_experts)) and torch.equal(
            slots, torch.arange(local_experts)):
        return ExpertShard(global_experts, local_experts, start=start, owned=mask)
    remap = torch.where(emap >= 0, emap, local_experts).to(torch.int32)
    return ExpertShard(global_experts, local_experts, remap=remap, owned=mask)
