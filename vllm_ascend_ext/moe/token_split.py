"""Which expert-parallel MoE layers take only their TP rank's share of the step's tokens
(pure).

vLLM 0.32 runs its MoE blocks sequence-parallel only with data parallelism
(``ParallelConfig.use_sequence_parallel_moe``: TP > 1, DP > 1, expert parallelism). With
DP 1 every TP rank holds the same tokens, and an expert-parallel layer sums the ranks'
partial outputs with the TP all-reduce: nothing is dispatched, since every rank already
holds every token, and a token exchange (MC2, all-to-all) over those replicated tokens
would send the same tokens from every rank.

Under **TP + EP without DP**, when ``ascend_ext.moe_dispatch`` asks for a token exchange
(``"mc2"`` or ``"alltoall"``), the plugin splits the tokens instead: each TP rank takes
its ``ceil(tokens / TP)`` (vLLM's ``sequence_parallel_chunk`` rule), the layer exchanges
them with the ranks that own their experts, and one all-gather over TP restores every
token, in place of the all-reduce.

- The plugin's own MoE block (``models/dsa_mlp.DsaMoE``: DeepSeek-V3.2 / GLM-5) splits
  before the layer, as vLLM's sequence-parallel blocks do: the shared expert runs on the
  same share with replicated weights.
- vLLM's blocks (Qwen MoE, Qwen3-Next / Qwen3.5, any other served by the plugin's MoE
  methods) hand the layer every token: the layer splits them itself (``moe/tp_split.py``,
  vLLM's modular-kernel seam), and vLLM's runner all-reduces the shared experts' TP
  partial sums alone.

What that buys, in bytes and calls per layer (``benchmarks/moe_exchange_bytes.py``, TP16
+ EP16): without shared experts in vLLM's block (DeepSeek-V3.2's block, Qwen3-30B-A3B)
the all-to-all moves what the all-reduce moves, in four calls and one host read, and MC2
with W8A8's int8 rows 0.88x of it in three calls; a vLLM block with shared experts
(Qwen1.5/2-MoE, Qwen3-Next) adds their all-reduce, about twice the bytes. ``auto`` keeps
the all-reduce.
"""

from __future__ import annotations

EXCHANGES = ("mc2", "alltoall")     # ascend_ext.moe_dispatch settings that ask for one


def splits_without_dp(parallel_config, moe_dispatch: str) -> bool:
    """The plugin splits the tokens where vLLM would not: TP > 1, expert parallelism,
    DP 1 (and no prefill context parallelism), a token exchange asked for."""
    return (moe_dispatch in EXCHANGES
            and bool(getattr(parallel_config, "enable_expert_parallel", False))
            and parallel_config.tensor_parallel_size > 1
            and parallel_config.data_parallel_size == 1
            and getattr(parallel_config, "prefill_context_parallel_size", 1) == 1)


def sequence_parallel_moe(parallel_config, moe_dispatch: str) -> bool:
    """Whether an expert-parallel MoE layer takes only this TP rank's share of the
    tokens: vLLM's rule, or TP + EP without DP with a token exchange asked for."""
    return (bool(getattr(parallel_config, "use_sequence_parallel_moe", False))
            or splits_without_dp(parallel_config, moe_dispatch))
