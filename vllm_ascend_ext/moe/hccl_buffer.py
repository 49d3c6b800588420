"""The HCCL buffer an MC2 expert-parallel group needs, and the start-up check of it.

``npu_moe_distribute_dispatch_v2`` / ``combine_v2`` exchange their rows through the EP
communicator's HCCL buffer (``HCCL_BUFFSIZE`` MB per communicator, 200 by default); the
dispatch documentation (约束说明, HCCL_BUFFSIZE) gives the size each call needs, and the
operator refuses a smaller buffer at its first call ("HCCL_BUFFSIZE is too SMALL"). The
formulas, in bytes, "/" an integer division:

* Atlas A3 (``comm_alg`` "" or "fullmesh_v1", what the plugin passes):
  ``2 * (local * max_bs * ep_world * Align512(Align32(2 * H) + 64)
  + (K + shared_expert_num) * max_bs * Align512(2 * H))``;
* Atlas A2, "fullmesh": ``2 * (max_bs * ep_world * min(local, K) * H * 2 + 2 MB)``;
* Atlas A2, "hierarchy" (taken for ``comm_alg`` "" when ``HCCL_INTRA_PCIE_ENABLE=1`` and
  ``HCCL_INTRA_ROCE_ENABLE=0``): ``experts * max_bs * (H * sizeof(x) + 4 * ((K + 7) / 8 * 8)
  * 4) + 4 MB + 100 MB``;

with ``Align512(x) = (x + 511) / 512 * 512`` and ``Align32`` alike, ``local`` the experts per
EP rank, ``max_bs`` the tokens per rank the plan's buffers hold (``moe/mc2.buffer_tokens``)
and ``shared_expert_num`` 1 (the operators' default, which the plugin keeps). Start-up
logs the megabytes for the configuration; with ``moe_dispatch: "mc2"`` it refuses, naming
the variable and the number, when ``HCCL_BUFFSIZE`` is smaller (``check_buffer``); with
``auto`` the plan's buffers shrink to what ``HCCL_BUFFSIZE`` holds (``tokens_that_fit``;
larger steps take the all-gather), with a warning that names the number.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from vllm_ascend_ext.errors import AscendExtError

ENV = "HCCL_BUFFSIZE"
DEFAULT_MB = 200
MB = 1 << 20
SHARED_EXPERT_NUM = 1  # the dispatch / combine default; the plugin passes none


def _align(x: int, to: int) -> int:
    return (x + to - 1) // to * to


@dataclass(frozen=True)
class Mc2Buffer:
    """One EP group's MC2 buffer need."""

    family: str
    algorithm: str       # "fullmesh_v1" (A3), "fullmesh" or "hierarchy" (A2)
    nbytes: int

    @property
    def megabytes(self) -> int:
        """What ``HCCL_BUFFSIZE`` must be at least (MB, rounded up)."""
        return -(-self.nbytes // MB)


def a2_algorithm(environ: Mapping[str, str]) -> str:
    """The A2 algorithm ``comm_alg`` "" takes: "hierarchy" with ``HCCL_INTRA_PCIE_ENABLE=1``
    and ``HCCL_INTRA_ROCE_ENABLE=0``, else "fullmesh"."""
    pcie, roce = environ.get("HCCL_INTRA_PCIE_ENABLE"), environ.get("HCCL_INTRA_ROCE_ENABLE")
    return "hierarchy" if pcie == "1" and roce == "0" else "fullmesh"


def required_buffer(family: str, *, hidden: int, top_k: int, experts: int, ep_world: int,
                    max_bs: int, x_bytes: int = 2,
                    environ: Mapping[str, str] | None = None) -> Mc2Buffer:
    """The documented buffer of one MC2 EP group (``environ`` picks A2's algorithm)."""
    local = experts // ep_world
    if family == "A3":
        rows = local * max_bs * ep_world * _align(_align(2 * hidden, 32) + 64, 512)
        shared = (top_k + SHARED_EXPERT_NUM) * max_bs * _align(2 * hidden, 512)
        return Mc2Buffer(family, "fullmesh_v1", 2 * (rows + shared))
    if family == "A2":
        if a2_algorithm(environ or {}) == "hierarchy":
            per_token = hidden * x_bytes + 4 * ((top_k + 7) // 8 * 8) * 4
            return Mc2Buffer(family, "hierarchy", experts * max_bs * per_token + 104 * MB)
        rows = max_bs * ep_world * min(local, top_k) * hidden * 2
        return Mc2Buffer(family, "fullmesh", 2 * (rows + 2 * MB))
    raise ValueError(f"the MC2 operators are documented for A2 and A3, not {family}")


def tokens_that_fit(family: str, *, hidden: int, top_k: int, experts: int, ep_world: int,
                    upto: int, x_bytes: int = 2,
                    environ: Mapping[str, str] | None = None) -> int:
    """The most tokens per rank (at most ``upto``) whose buffer ``HCCL_BUFFSIZE`` holds; 0
    when not even one token's does (the need grows with the tokens: a bisection)."""
    have, env = configured_mb(environ or {}), environ or {}

    def fits(tokens: int) -> bool:
        return required_buffer(family, hidden=hidden, top_k=top_k, experts=experts,
                               ep_world=ep_world, max_bs=tokens, x_bytes=x_bytes,
                               environ=env).megabytes <= have

    low, high = 0, upto
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return low


def configured_mb(environ: Mapping[str, str]) -> int:
    """``HCCL_BUFFSIZE`` as the HCCL runtime reads it (MB; 200 when unset)."""
    text = environ.get(ENV, "").strip()
    if not text:
        return DEFAULT_MB
    try:
        value = int(text)
    except ValueError:
        raise AscendExtError(f"{ENV}={text!r}: HCCL takes an integer number of MB "
                             f"(>= 1; default {DEFAULT_MB})") from None
    if value < 1:
        raise AscendExtError(f"{ENV}={value}: HCCL takes an integer number of MB >= 1")
    return value


def check_buffer(need: Mc2Buffer, environ: Mapping[str, str], what: str) -> None:
    """Refuse, naming ``HCCL_BUFFSIZE`` and the number, when the configured buffer is
    smaller than ``need``; ``what`` describes the configuration for the message."""
    have = configured_mb(environ)
    if have < need.megabytes:
        raise AscendExtError(
            f"MC2 ({what}) needs {ENV} >= {need.megabytes} MB per communicator "
            f"({need.family}, {need.algorithm}: the dispatch documentation's formula), but "
            f"{ENV} is {have} MB{'' if ENV in environ else ' (the default)'}; the operator "
            f"would refuse at its first call. Set {ENV}={need.megabytes} (HCCL reserves it "
            f"for every communicator), lower --max-num-seqs, or set "
            f"ascend_ext.moe_dispatch to 'allgather'")
