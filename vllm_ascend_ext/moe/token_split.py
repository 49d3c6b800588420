"""Which MoE blocks run sequence-parallel: each TP rank takes its share of the step's
tokens into the MoE layer, and the block all-gathers the outputs after it (pure).

vLLM 0.32 runs its MoE blocks sequence-parallel only with data parallelism
(``ParallelConfig.use_sequence_parallel_moe``: TP > 1, DP > 1, expert parallelism). With
DP 1 every TP rank holds the same tokens, and an expert-parallel layer sums the ranks'
partial outputs with the TP all-reduce: nothing is dispatched, since every rank already
holds every token, and a token exchange (MC2, all-to-all) would send the same tokens from
every rank.

The plugin's own MoE block (``models/dsa_mlp.DsaMoE``: DeepSeek-V3.2 / GLM-5) also runs
sequence-parallel under **TP + EP without DP** when ``ascend_ext.moe_dispatch`` asks for a
token exchange (``"mc2"`` or ``"alltoall"``): each TP rank takes its
``ceil(tokens / TP)`` (vLLM's ``sequence_parallel_chunk``), the layer exchanges them with
the ranks that own their experts, the shared expert runs on the same share (replicated
weights, as vLLM's sequence-parallel MoE holds them), and one all-gather over TP restores
every token, in place of the all-reduce. What that buys, in bytes and calls per layer
(``benchmarks/moe_exchange_bytes.py``, TP16 + EP16): the all-to-all moves what the
all-reduce moves, in four calls and one host read; MC2 with W8A8's int8 rows moves 0.88x
of it in three calls. ``auto`` keeps the all-reduce. vLLM's own MoE blocks (Qwen MoE,
Qwen3-Next / Qwen3.5) decide for themselves and stay on the all-reduce: for them a forced
exchange is refused by name.
"""

from __future__ import annotations

EXCHANGES = ("mc2", "alltoall")     # ascend_ext.moe_dispatch settings that ask for one


def splits_without_dp(parallel_config, moe_dispatch: str) -> bool:
    """The plugin's MoE block runs sequence-parallel where vLLM's would not: TP > 1,
    expert parallelism, DP 1 (and no prefill context parallelism), a token exchange asked
    for."""
    return (moe_dispatch in EXCHANGES
            and bool(getattr(parallel_config, "enable_expert_parallel", False))
            and parallel_config.tensor_parallel_size > 1
            and parallel_config.data_parallel_size == 1
            and getattr(parallel_config, "prefill_context_parallel_size", 1) == 1)


def sequence_parallel_moe(parallel_config, moe_dispatch: str, own_block: bool) -> bool:
    """Whether a MoE block runs sequence-parallel: vLLM's rule, and, for the plugin's own
    block (``own_block``), TP + EP without DP with a token exchange asked for."""
    return (bool(getattr(parallel_config, "use_sequence_parallel_moe", False))
            or (own_block and splits_without_dp(parallel_config, moe_dispatch)))


def replicated_hint(parallel_config, moe_dispatch: str, own_block: bool) -> str:
    """What a refusal of a forced exchange over replicated TP tokens adds under TP + EP
    without DP: why the tokens stay replicated ("" for the plugin's block, which splits
    them, and for other layouts, whose refusals say enough)."""
    if own_block or not splits_without_dp(parallel_config, moe_dispatch):
        return ""
    return ("this model's MoE blocks are vLLM's: without data parallelism every TP rank "
            "holds the same tokens (only the plugin's DeepSeek-V3.2 / GLM-5 block splits "
            "them there)")
