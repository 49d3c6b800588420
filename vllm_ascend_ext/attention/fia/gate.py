"""The split gate: one pure function deciding single vs split FIA calls, with a reason.

Shared by the builder (per step) and ``python -m vllm_ascend_ext.tools.split_gate``
(the explain tool), so the tool cannot drift from what the engine does.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_ascend_ext.platform.soc import SPLIT_PAYS_FAMILIES

# Known-regressing family (sglang PR 34387 on Ascend 950): head_dim 256 with at most
# 3 local query heads regressed by 1.6-11.1%; head_dim 128 never regressed.
REGRESSING_MIN_HEAD_DIM = 256
REGRESSING_MAX_LOCAL_Q_HEADS = 3


@dataclass(frozen=True)
class LayerTraits:
    """Static facts of the attention layers a builder serves (local = after TP)."""

    head_dim: int
    local_q_heads: int
    local_kv_heads: int
    causal: bool = True
    decoder_self_attention: bool = True
    sliding_window: bool = False
    sinks: bool = False
    alibi: bool = False


@dataclass(frozen=True)
class Decision:
    split: bool
    reason: str


def unsupported_reason(t: LayerTraits) -> str | None:
    for flag, name in ((not t.decoder_self_attention, "not decoder self-attention"),
                       (not t.causal, "non-causal attention"),
                       (t.sliding_window, "sliding window"), (t.sinks, "attention sinks"),
                       (t.alibi, "ALiBi")):
        if flag:
            return f"unsupported: {name}"
    return None


def decide(mode: str, soc_family: str, traits: LayerTraits, *, batch_invariant: bool,
           num_decodes: int, num_prefills: int) -> Decision:
    """Single or split for one step. Precedence, highest first: unsupported/unsafe
    attention features -> single; not a mixed step -> single; "off" -> single;
    batch invariance -> split; "on" -> split; "auto" -> SoC, GQA and shape rules."""
    bad = unsupported_reason(traits)
    if bad:
        return Decision(False, bad)
    if num_decodes == 0 or num_prefills == 0:
        return Decision(False, "not mixed")
    if mode == "off":
        return Decision(False, "mixed_split=off")
    if batch_invariant:
        return Decision(True, "batch invariance")
    if mode == "on":
        return Decision(True, "mixed_split=on")
    if traits.local_kv_heads <= 0 or traits.local_q_heads % traits.local_kv_heads:
        return Decision(False, "GQA not divisible")
    if soc_family not in SPLIT_PAYS_FAMILIES:
        return Decision(False, f"soc {soc_family} not in {'/'.join(SPLIT_PAYS_FAMILIES)}")
    if (traits.head_dim >= REGRESSING_MIN_HEAD_DIM
            and traits.local_q_heads <= REGRESSING_MAX_LOCAL_Q_HEADS):
        return Decision(False, f"regressing shape: head_dim {traits.head_dim} with "
                               f"{traits.local_q_heads} local q heads")
    return Decision(True, "auto")
