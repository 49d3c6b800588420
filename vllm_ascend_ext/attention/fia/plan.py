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
