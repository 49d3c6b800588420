"""Which experts a rank computes under expert parallelism, as ``npu_moe_init_routing_v2``
arguments (pure, decided once per layer when it is built).

vLLM's MoE layer carries an ``expert_map`` when expert parallelism is on: a
``[global_num_experts]`` int32 tensor holding each global expert's local slot on this rank,
``-1`` for experts other ranks own (``expert_map_manager.determine_expert_map``; linear or
round-robin placement). The rank's weights hold only its ``L = local_num_experts``
experts, in slot order. Routing stays global (top-k over every expert); the permutation
and the grouped matmuls run on local slots, kept within what torch-npu 2.13 documents:

- one gather maps the global ids to local slots, every foreign expert to slot ``L``, and
  ``npu_moe_init_routing_v2`` takes ``expert_num = L + 1`` with the whole range active: the
  gather index it returns is a full permutation of ``[0, N*K)`` (``npu_moe_token_unpermute``
  documents "取值范围是[0, tokens_num * topK_num - 1]，且没有重复索引": no ``-1``), the
  foreign pairs' rows last, counted in group ``L``;
- the grouped matmuls take the first ``L`` counts: their groups end before the ``N*K``
  rows, a departure from ``npu_grouped_matmul``'s documentation (an exact cover) that
  vllm-ascend's all-gather and MC2 dispatchers make on A2/A3. The plugin makes it only
  inside ``groups_may_end_early()`` (``ops/grouped_matmul.py``), where contract mode counts
  it as a departure instead of a violation; ``npu_grouped_matmul_swiglu_quant`` documents
  the rows past its groups as dirty data to be cut off;
- the rows past the local groups (the foreign pairs') are cleared before
  ``npu_moe_token_unpermute`` (``where`` on the row number against the local count: the
  "截断" that documentation asks for), so no undefined value reaches the sum and the
  foreign pairs add zero whatever their routing weights.

Six calls per layer more than a rank with every expert (the id gather; the group slice;
sum, arange, compare, where: counted in ``tests/ut/moe/test_expert_parallel.py``), all on the
device, no host read. Tokens routed to other ranks' experts contribute nothing here; vLLM
sums the ranks' partial outputs (its all-reduce, or the DP / sequence-parallel combine
through the plugin's communicator) as for its own EP kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_ascend_ext.moe.routing import UnsupportedMoEError


@dataclass(frozen=True)
class ExpertShard:
    global_experts: int
    local_experts: int
    remap: torch.Tensor | None = None     # [E] int32: global id -> local slot, L if foreign
    start: int | None = None              # first global id when the experts are a block

    @property
    def is_sharded(self) -> bool:
        return self.remap is not None

    @property
    def expert_num(self) -> int:
        """``npu_moe_init_routing_v2``'s ``expert_num``: the local slots and, sharded,
        one for every foreign expert."""
        return self.local_experts + 1 if self.is_sharded else self.global_experts

    @property
    def active_range(self) -> tuple[int, int]:
        return 0, self.expert_num

    def local_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """The ids the routing operator takes (int32)."""
        return self.remap[ids] if self.is_sharded else ids

    def groups(self, counts: torch.Tensor) -> torch.Tensor:
        """The grouped matmuls' group sizes: the local experts' counts."""
        return counts[:self.local_experts] if self.is_sharded else counts

    def clear_foreign_rows(self, rows: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
        """``rows`` with every row past the local ``groups`` (``self.groups(counts)``) set
        to zero."""
        if not self.is_sharded:
            return rows
        kept = groups.sum()
        number = torch.arange(rows.shape[0], device=rows.device)
        return torch.where((number < kept)[:, None], rows, 0.0)

    def to(self, device) -> ExpertShard:
        if not self.is_sharded:
            return self
        return ExpertShard(self.global_experts, self.local_experts, self.remap.to(device),
                           self.start)

    def describe(self) -> str:
        if not self.is_sharded:
            return f"all {self.global_experts} experts"
        if self.start is not None:
            return (f"experts [{self.start}, {self.start + self.local_experts}) of "
                    f"{self.global_experts}")
        return f"{self.local_experts} of {self.global_experts} experts (round robin)"


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
    block = torch.equal(owned, torch.arange(start, start + local_experts)) and torch.equal(
        slots, torch.arange(local_experts))
    remap = torch.where(emap >= 0, emap, local_experts).to(torch.int32)
    return ExpertShard(global_experts, local_experts, remap, start if block else None)
