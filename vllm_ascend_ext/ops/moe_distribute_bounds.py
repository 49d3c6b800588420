"""The documented bounds of the MC2 operators, per SoC family (pure data and one function).

From torch-npu's operator documentation (op-plugin ``docs/context/
torch_npu-npu_moe_distribute_dispatch_v2.md`` and ``..._combine_v2.md``, 约束说明 and
参数说明; the 2.13 wheel documents neither operator). The dispatcher gate
(``moe/mc2.py``) takes the MC2 route only inside them, and contract mode checks every
call against them (``contract/mc2_rules.py``): one table for both.

Where the two pages differ, a call must satisfy both (the operators are used as a pair):
H is [1024, 8192] for the dispatch on A3 but [1024, 7168] for the combine; the combine
takes ep_world_size [2, 384] on A3 (the dispatch [2, 768]), 16/32/64 on A2 (the
dispatch, "fullmesh", also 128/256), and moe_expert_num up to 512 (the dispatch 1024).
"""

from __future__ import annotations

from dataclasses import dataclass

DOC_PAGES = ("op-plugin docs/context/torch_npu-npu_moe_distribute_dispatch_v2.md",
             "op-plugin docs/context/torch_npu-npu_moe_distribute_combine_v2.md")
FAMILIES = ("A2", "A3")          # 产品支持情况: Atlas A2 and Atlas A3 (no Ascend 950)
MAX_K = 16                       # "0<K≤16" (both pages)
MAX_EXPERTS = 512                # combine: [1, 512]; dispatch: [1, 1024]


@dataclass(frozen=True)
class FamilyBounds:
    ep_world_sizes: tuple[int, ...] | None   # the allowed sizes, or None for a range
    ep_range: tuple[int, int]                # inclusive, when ep_world_sizes is None
    hidden: tuple[int, int]                  # inclusive bounds of H (low exclusive if 0)
    hidden_multiple: int
    max_bs: int                              # "0<BS≤..."
    max_local_experts: int | None            # A2: moe_expert_num / ep_world_size <= 24
    max_experts_placed: int | None           # A3 combine: local * ep_world_size <= 1280


BOUNDS = {
    # A2 ("fullmesh"): ep_world_size 16/32/64 (the combine's list), H (0, 7168] and a
    # multiple of 32, BS <= 256, at most 24 experts per rank.
    "A2": FamilyBounds((16, 32, 64), (16, 64), (0, 7168), 32, 256, 24, None),
    # A3: ep_world_size [2, 384] (combine), H [1024, 7168] (combine), BS <= 512,
    # local experts * ep_world_size <= 1280.
    "A3": FamilyBounds(None, (2, 384), (1024, 7168), 1, 512, None, 1280),
}


def max_tokens(family: str) -> int | None:
    """The most tokens per rank one dispatch / combine call takes on ``family`` ("0<BS≤..."),
    ``None`` where the operators are not documented."""
    return BOUNDS[family].max_bs if family in BOUNDS else None


def outside(family: str, *, hidden: int, bs: int, top_k: int, experts: int,
            ep_world_size: int) -> list[str]:
    """Why a call with these sizes is outside the documented bounds (empty: inside)."""
    if family not in BOUNDS:
        return [f"the MC2 operators are documented for Atlas {'/'.join(FAMILIES)} only, "
                f"not {family}"]
    b, why = BOUNDS[family], []
    if b.ep_world_sizes is not None and ep_world_size not in b.ep_world_sizes:
        why.append(f"ep_world_size {ep_world_size} not in {b.ep_world_sizes} on {family}")
    if b.ep_world_sizes is None and not b.ep_range[0] <= ep_world_size <= b.ep_range[1]:
        why.append(f"ep_world_size {ep_world_size} not in [{b.ep_range[0]}, {b.ep_range[1]}] "
                   f"on {family}")
    low, high = b.hidden
    if not (low < hidden if low == 0 else low <= hidden) or hidden > high \
            or hidden % b.hidden_multiple:
        bound = f"({low}, {high}]" if low == 0 else f"[{low}, {high}]"
        extra = f", a multiple of {b.hidden_multiple}" if b.hidden_multiple > 1 else ""
        why.append(f"hidden size {hidden} not in {bound}{extra} on {family}")
    if not 0 < bs <= b.max_bs:
        why.append(f"{bs} tokens per rank not in (0, {b.max_bs}] on {family}")
    if not 0 < top_k <= min(MAX_K, experts):
        why.append(f"top-k {top_k} not in (0, {min(MAX_K, experts)}]")
    if not 0 < experts <= MAX_EXPERTS or experts % max(ep_world_size, 1):
        why.append(f"{experts} experts: not in [1, {MAX_EXPERTS}] or not a multiple of "
                   f"ep_world_size {ep_world_size}")
    local = experts // max(ep_world_size, 1)
    if b.max_local_experts is not None and local > b.max_local_experts:
        why.append(f"{local} experts per rank > {b.max_local_experts} on {family}")
    if b.max_experts_placed is not None and local * ep_world_size > b.max_experts_placed:
        why.append(f"{local} experts per rank x {ep_world_size} ranks > "
                   f"{b.max_experts_placed} on {family}")
    return why
