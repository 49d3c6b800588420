"""Pure decode/prefill boundary and span slicing for mixed chunked-prefill steps.

vLLM reorders each batch decode-first (query length <= the decode threshold) when
a builder asks for it. Here the boundary is derived from host copies only, checked
against vLLM's own count, and turned into the host lists of the two FIA calls.

Every step is a tuple of spans, one FIA call each (``step_spans``): none for a step
without tokens, one over the whole step, or (decode, prefill) for a split mixed step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vllm_ascend_ext.attention.fia.plan import BatchMetadataError


@dataclass(frozen=True)
class Boundary:
    num_decodes: int
    num_decode_tokens: int
    num_prefills: int
    num_prefill_tokens: int

    @property
    def mixed(self) -> bool:
        return self.num_decodes > 0 and self.num_prefills > 0


@dataclass(frozen=True)
class Span:
    """One FIA call: tokens [tok0, tok1), requests [req0, req1), its host lists."""

    tok0: int
    tok1: int
    req0: int
    req1: int
    actual_seq_lengths_q: tuple[int, ...]  # cumulative, rebased to start at 0
    actual_seq_lengths_kv: tuple[int, ...]
    name: str = "single"  # profiler range ascend_ext.fia_mixed.<name>

    @property
    def rows(self) -> slice:
        """The span's rows of the step's query and output."""
        return slice(self.tok0, self.tok1)

    @property
    def reqs(self) -> slice:
        """The span's rows of the step's block table."""
        return slice(self.req0, self.req1)

    @property
    def host_lists(self) -> dict[str, tuple[int, ...]]:
        """FIA's host-list keywords for this call."""
        return {"actual_seq_lengths": self.actual_seq_lengths_q,
                "actual_seq_lengths_kv": self.actual_seq_lengths_kv}


def find_boundary(cu_q: Sequence[int], decode_threshold: int) -> Boundary:
    """Boundary of a decode-first batch from cumulative query ends (len = num_reqs).

    Decodes are the leading requests with 1 <= query length <= threshold (vLLM
    puts decodes and short extends first); everything after the first longer
    request is the prefill span, which may still hold short *first* chunks (vLLM
    orders pure prefills last whatever their length). Zero-length (padding)
    requests must trail.
    """
    starts = (0, *cu_q[:-1])
    lens = [end - start for start, end in zip(starts, cu_q)]
    nd = 0
    while nd < len(lens) and 0 < lens[nd] <= decode_threshold:
        nd += 1
    first_pad = next((b for b in range(nd, len(lens)) if lens[b] == 0), len(lens))
    if any(lens[b] > 0 for b in range(first_pad, len(lens))):
        raise BatchMetadataError(
            f"zero-length request {first_pad} precedes real requests; padding must trail"
        )
    num_real = sum(1 for x in lens if x > 0)
    nd_tok = cu_q[nd - 1] if nd else 0
    total = cu_q[-1] if cu_q else 0
    return Boundary(nd, nd_tok, num_real - nd, total - nd_tok)


def check_against_vllm(ours: Boundary, vllm_counts: tuple[int, int, int, int],
                       num_padded_tokens: int) -> None:
    """Fail loudly when vLLM's ``split_decodes_and_prefills`` disagrees with the
    boundary derived from ``query_start_loc_cpu`` (padding tokens/requests, which
    vLLM counts as prefill, are allowed)."""
    nd, np_, nd_tok, np_tok = vllm_counts
    if nd != ours.num_decodes or nd_tok != ours.num_decode_tokens:
        raise BatchMetadataError(
            "decode/prefill boundary mismatch: split_decodes_and_prefills gives "
            f"num_decodes={nd}, num_decode_tokens={nd_tok}; query_start_loc_cpu gives "
            f"num_decodes={ours.num_decodes}, num_decode_tokens={ours.num_decode_tokens}"
        )
    if np_ < ours.num_prefills or not (
        ours.num_prefill_tokens <= np_tok <= ours.num_prefill_tokens + num_padded_tokens
    ):
        raise BatchMetadataError(
            "decode/prefill boundary mismatch: split_decodes_and_prefills gives "
            f"num_prefills={np_}, num_prefill_tokens={np_tok}; query_start_loc_cpu gives "
            f"num_prefills={ours.num_prefills}, num_prefill_tokens={ours.num_prefill_tokens} "
            f"(+{num_padded_tokens} padding tokens)"
        )


def spans(cu_q: Sequence[int], kv_lens: Sequence[int], b: Boundary) -> tuple[Span, Span]:
    """(decode span, prefill span); the prefill span keeps trailing padding requests."""
    nd, nd_tok = b.num_decodes, b.num_decode_tokens
    total = cu_q[-1] if cu_q else 0
    dec = Span(0, nd_tok, 0, nd, tuple(cu_q[:nd]), tuple(kv_lens[:nd]), "decode")
    pre = Span(nd_tok, total, nd, len(cu_q), tuple(c - nd_tok for c in cu_q[nd:]),
               tuple(kv_lens[nd:]), "prefill")
    return dec, pre


def step_spans(cu_q: Sequence[int], kv_lens: Sequence[int],
               split_at: Boundary | None = None) -> tuple[Span, ...]:
    """The FIA calls of one step, in order: none when the step has no tokens; the
    (decode, prefill) ``spans`` when split at a mixed boundary; else one span over every
    token and request (padding requests included)."""
    total = cu_q[-1] if cu_q else 0
    if total == 0:
        return ()
    if split_at is not None:
        if not split_at.mixed:
            raise BatchMetadataError(
                f"a split needs decodes and prefills: {split_at.num_decodes} decodes, "
                f"{split_at.num_prefills} prefills")
        return spans(cu_q, kv_lens, split_at)
    return (Span(0, total, 0, len(cu_q), tuple(cu_q), tuple(kv_lens)),)
