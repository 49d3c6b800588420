"""Pure per-step planning for the FIA backend: host lists from host copies only."""

from __future__ import annotations

from collections.abc import Sequence


class BatchMetadataError(ValueError):
    """Inconsistent batch metadata; computing attention on it would be wrong."""


def host_lists(
    query_start_loc: Sequence[int], seq_lens: Sequence[int], num_actual_tokens: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """FIA's host lists from host copies of ``query_start_loc`` and ``seq_lens``.

    Returns (cumulative query ends, per-request kv lengths). Requests with zero
    query tokens are runner padding: they are kept (their kv length is clamped to
    0 so they read nothing). Raises :class:`BatchMetadataError` naming the field.
    """
    qsl = [int(x) for x in query_start_loc]
    lens = [int(x) for x in seq_lens]
    num_reqs = len(qsl) - 1
    if num_reqs < 0 or qsl[0] != 0:
        raise BatchMetadataError(f"query_start_loc must start at 0, got {qsl[:1]}")
    if len(lens) != num_reqs:
        raise BatchMetadataError(
            f"seq_lens has {len(lens)} entries but query_start_loc describes {num_reqs} requests"
        )
    if qsl[-1] > num_actual_tokens:
        raise BatchMetadataError(
            f"query_start_loc[-1] = {qsl[-1]} exceeds num_actual_tokens = {num_actual_tokens}"
        )
    kv = []
    for b in range(num_reqs):
        q_len = qsl[b + 1] - qsl[b]
        if q_len < 0:
            raise BatchMetadataError(f"query_start_loc decreases at request {b}: {qsl[b]} -> {qsl[b+1]}")
        if q_len > 0 and lens[b] < q_len:
            raise BatchMetadataError(
                f"request {b}: seq_lens = {lens[b]} is shorter than its {q_len} query tokens"
            )
        kv.append(lens[b] if q_len > 0 else 0)
    return tuple(qsl[1:]), tuple(kv)


def pad_to_graph(cu_q: Sequence[int], kv_lens: Sequence[int],
                 num_tokens: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Host lists for a step replayed on a graph captured for ``num_tokens`` tokens.

    FIA in TND layout requires the query's T to equal the last query end ("queryT must
    be equal to the last element of actualSequenceLengthQ", error 561002), and a replayed
    graph always runs its captured T. vLLM pads a smaller batch with zero-length
    requests; they carry the extra tokens here (spread evenly, the first ones taking any
    remainder), each reading as many KV positions as it has tokens (its block-table row is
    the null block). A step with extra tokens and no padding request cannot be replayed.
    """
    cu_q, kv_lens = tuple(cu_q), tuple(kv_lens)
    last = cu_q[-1] if cu_q else 0
    extra = num_tokens - last
    if extra == 0:
        return cu_q, kv_lens
    if extra < 0:
        raise BatchMetadataError(
            f"the step's requests hold {last} tokens, more than the graph's {num_tokens}")
    starts = (0,) + cu_q[:-1]
    pad = 0
    while pad < len(cu_q) and cu_q[-1 - pad] == starts[-1 - pad]:
        pad += 1
    if pad == 0:
        raise BatchMetadataError(
            f"the graph runs {num_tokens} tokens, the step's requests end at {last}, and no "
            "zero-length padding request can take the rest: FIA in TND layout needs the "
            "last query end to equal the query's tokens (error 561002)")
    real = len(cu_q) - pad
    q_pad = [extra // pad + (1 if i < extra % pad else 0) for i in range(pad)]
    ends = list(cu_q[:real])
    for q in q_pad:
        ends.append((ends[-1] if ends else 0) + q)
    return tuple(ends), kv_lens[:real] + tuple(q_pad)
