"""Which token exchange an expert-parallel MoE layer takes in a step (pure).

A layer's exchange is planned once, when it is built (``moe/mc2.py``, ``moe/alltoall.py``):
no internal exchange (vLLM's runner all-gathers the tokens and reduce-scatters the
outputs, or there is nothing to exchange), all-to-all (every eager step), or MC2. MC2's
buffers hold at most the operators' documented tokens per rank (512 on A3, 256 on A2); a
plan sized below the engine's step budget is *step-sized*, and each step the layer picks:

- MC2 when the most tokens any EP rank brings to the step fits the plan (decode-sized
  steps);
- otherwise all-to-all when ``ascend_ext.moe_dispatch`` is ``"alltoall"`` (one host read,
  vllm-ascend's A3 choice for prefill-sized steps), else all-gather, which the layer runs
  itself through vLLM's EP group (the same ``dispatch_router_logits`` / ``combine`` vLLM's
  runner runs for a layer with no exchange of its own: the runner skips it for this layer,
  whose method reports one).

A step captured into a decode graph (and so every replay of it) never takes the
all-to-all: its split sizes are read on the host each step, which a graph cannot hold
(on an NPU the read fails while the stream captures; a replay would reuse the capture's
sizes). Such a step takes MC2 when the plan covers it, else the all-gather, whose sizes
are vLLM's per-rank sizes of the step: padded alike on every DP rank in a graph step,
so the capture's sizes are every replay's.

Every EP rank decides alike: the token count is vLLM's per-rank sizes of the step, host
integers each rank holds (no device read); whether the step is a graph step is vLLM's
choice, the same on every DP rank (it synchronizes the ranks' graph mode); the layer's
plan is the same on every rank.
"""

from __future__ import annotations

from collections.abc import Callable

from vllm_ascend_ext.moe.mc2 import Mc2Plan

LOCAL, MC2, ALLTOALL, ALLGATHER = "local", "mc2", "alltoall", "allgather"


def step_route(mc2: Mc2Plan | None, alltoall: bool, tokens: Callable[[], int],
               graph: Callable[[], bool] = lambda: False) -> str:
    """The step's exchange for a layer planned with ``mc2`` (or ``None``) and, when
    ``alltoall``, an all-to-all plan. ``tokens()`` (the most tokens any EP rank brings to
    the step) is asked whenever there is an MC2 plan: a plan for every step still never
    hands the operators more than its buffers hold; ``graph()`` (the step is captured into
    a decode graph) only when the all-to-all would be taken."""
    if mc2 is not None and tokens() <= mc2.tokens:
        return MC2
    if alltoall and not graph():
        return ALLTOALL
    return ALLGATHER if mc2 is not None or alltoall else LOCAL
