"""How one step's requests split between the GDN layer's two paths (pure, host values).

- the **recurrent span**: decodes (one token on a request that has a state) and, with
  speculative decoding, every row the runner marks as a draft row (``drafts >= 0``:
  verify rows, including rows with zero drafts) — one token-by-token recurrence call;
- the **prefill span**: every other row with tokens (first chunks start from a zero
  state, later chunks from the request's slot) — one chunked call.

Rows with no tokens (padding) belong to neither. vLLM orders a batch decode-first, so
each span is usually one contiguous token range; when it is not (a short prefill chunk
reordered among verify rows), ``token_order`` lists the tokens span by span so the
layer gathers its inputs once and scatters its output back.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_ascend_ext.errors import AscendExtError


class GdnBatchError(AscendExtError):
    """Step metadata the GDN layer cannot compute correctly."""


@dataclass(frozen=True)
class GdnSpans:
    rec_rows: tuple[int, ...]        # batch rows in the recurrent span, in batch order
    pre_rows: tuple[int, ...]        # batch rows in the prefill span
    rec_lens: tuple[int, ...]
    pre_lens: tuple[int, ...]
    pre_has_state: tuple[bool, ...]  # prefill rows continuing a state (not first chunks)
    speculative: bool                # the recurrent span applies accepted-token offsets
    token_order: tuple[int, ...] | None  # None when spans are contiguous, decode-first

    @property
    def rec_tokens(self) -> int:
        return sum(self.rec_lens)

    @property
    def pre_tokens(self) -> int:
        return sum(self.pre_lens)

    @property
    def kind(self) -> str:
        parts = [name for name, rows in (("spec" if self.speculative else "decode", self.rec_rows),
                                         ("prefill", self.pre_rows)) if rows]
        return "+".join(parts) or "empty"


def plan_spans(query_lens: list[int], computed: list[int], drafts: list[int] | None,
               num_spec: int) -> GdnSpans:
    """``query_lens`` / ``computed`` (tokens already in the state) per row; ``drafts``: the
    runner's draft counts (-1 for rows that are not draft rows), None without speculation."""
    n = len(query_lens)
    if len(computed) != n or (drafts is not None and len(drafts) != n):
        raise GdnBatchError(f"GDN step: {n} query lengths, {len(computed)} computed counts, "
                            f"{None if drafts is None else len(drafts)} draft counts")
    rec, pre = [], []
    for i, (q, c) in enumerate(zip(query_lens, computed)):
        if q < 0 or c < 0:
            raise GdnBatchError(f"GDN step: row {i} has query length {q}, computed {c}")
        if q == 0:
            continue
        if drafts is not None and drafts[i] >= 0:
            if q != drafts[i] + 1 or q > num_spec + 1:
                raise GdnBatchError(
                    f"GDN step: draft row {i} has {q} tokens for {drafts[i]} drafts "
                    f"(expected drafts + 1 <= num_speculative_tokens + 1 = {num_spec + 1})")
            if c == 0:
                raise GdnBatchError(f"GDN step: draft row {i} has no state (computed 0)")
            rec.append(i)
        elif drafts is None and q == 1 and c > 0:
            rec.append(i)
        else:
            pre.append(i)
    starts = [0]
    for q in query_lens:
        starts.append(starts[-1] + q)
    order = [t for i in rec + pre for t in range(starts[i], starts[i + 1])]
    contiguous = order == list(range(len(order)))
    return GdnSpans(
        rec_rows=tuple(rec), pre_rows=tuple(pre),
        rec_lens=tuple(query_lens[i] for i in rec), pre_lens=tuple(query_lens[i] for i in pre),
        pre_has_state=tuple(computed[i] > 0 for i in pre),
        speculative=drafts is not None,
        token_order=None if contiguous else tuple(order))
