"""The GDN metadata builder: all per-step work of the plugin's GDN layers, once per step.

A subclass of vLLM's ``GDNAttentionMetadataBuilder``: the runner hands the accepted-token
counts and draft counts only to builders of that class. ``build`` replaces vLLM's
entirely. It reads host values only (``query_start_loc_cpu``,
``seq_lens_cpu_upper_bound``, the runner's host draft counts) and touches device data only
through device-side gathers (block table rows, accepted counts): no ``.item()``,
``.tolist()`` or ``nonzero`` on device tensors.
"""

from __future__ import annotations

import torch
from vllm.v1.attention.backend import AttentionCGSupport
from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadataBuilder
from vllm.v1.attention.backends.utils import mamba_get_block_table_tensor

from vllm_ascend_ext.attention.gdn.metadata import GdnMetadata, GdnSpan
from vllm_ascend_ext.attention.gdn.spans import GdnBatchError, GdnSpans, plan_spans


def _to_device(values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    host = torch.tensor(values, dtype=dtype)
    if device.type == "cpu" or device.type == "meta":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def host_lists(cam, num_reqs: int) -> tuple[list[int], list[int]]:
    """(query lengths, tokens already computed) per row, from the host copies."""
    if cam.seq_lens_cpu_upper_bound is None:
        raise GdnBatchError("CommonAttentionMetadata.seq_lens_cpu_upper_bound is missing: the "
                            "GDN builder reads sequence lengths only from host copies")
    qsl = [int(v) for v in cam.query_start_loc_cpu[:num_reqs + 1].tolist()]
    query = [qsl[i + 1] - qsl[i] for i in range(num_reqs)]
    seqs = [int(v) for v in cam.seq_lens_cpu_upper_bound[:num_reqs].tolist()]
    return query, [max(s - q, 0) for s, q in zip(seqs, query)]


def _span(rows: tuple[int, ...], lens: tuple[int, ...], has_state: tuple[bool, ...],
          table: torch.Tensor, device: torch.device, *, per_token_column: bool) -> GdnSpan:
    """``table``: the span's rows of the state block table (device). Per-token slots are
    column ``position`` of the row (verify rows: one slot per token) or column 0 (all
    of a prefill's tokens update the request's one slot)."""
    starts = [0]
    for n in lens:
        starts.append(starts[-1] + n)
    row_of = [r for r, n in enumerate(lens) for _ in range(n)]
    col_of = ([p for n in lens for p in range(n)] if per_token_column
              else [0] * len(row_of))
    token_slots = table[_to_device(row_of, torch.int64, device),
                        _to_device(col_of, torch.int64, device)]
    return GdnSpan(
        num_reqs=len(rows), num_tokens=starts[-1], max_len=max(lens),
        query_start_loc=_to_device(starts, torch.int32, device),
        lengths=_to_device(list(lens), torch.int32, device),
        slots=table[:, 0].to(torch.int32),
        token_slots=token_slots.to(torch.int32),
        has_initial_state=_to_device(list(has_state), torch.bool, device))


class AscendGdnMetadataBuilder(GDNAttentionMetadataBuilder):
    # Hybrid models run eager on the NPU platform (platform/graph_mode.py).
    _cudagraph_support = AttentionCGSupport.NEVER

    def build(self, common_prefix_len, common_attn_metadata, num_accepted_tokens=None,
              num_decode_draft_tokens_cpu=None, fast_build: bool = False) -> GdnMetadata:
        cam = common_attn_metadata
        n = cam.num_reqs
        query, computed = host_lists(cam, n)
        drafts = None
        if self.use_spec_decode and num_decode_draft_tokens_cpu is not None:
            drafts = [int(v) for v in num_decode_draft_tokens_cpu[:n].tolist()]
        spans = plan_spans(query, computed, drafts, self.num_spec)
        return self.build_from_spans(spans, cam, num_accepted_tokens)

    def build_from_spans(self, spans: GdnSpans, cam, num_accepted_tokens) -> GdnMetadata:
        device = cam.query_start_loc.device
        table = mamba_get_block_table_tensor(cam.block_table_tensor, cam.seq_lens,
                                             self.kv_cache_spec,
                                             self.vllm_config.cache_config.mamba_cache_mode)
        recurrent = prefill = spec_table = accepted = None
        accepted_in_op = False
        if spans.rec_rows:
            rows = _to_device(list(spans.rec_rows), torch.int64, device)
            rec_table = table.index_select(0, rows)[:, :self.num_spec + 1]
            recurrent = _span(spans.rec_rows, spans.rec_lens, (True,) * len(spans.rec_rows),
                              rec_table, device, per_token_column=spans.speculative)
            if spans.speculative:
                if num_accepted_tokens is None:
                    raise GdnBatchError("GDN step: draft rows but no accepted-token counts "
                                        "from the runner")
                spec_table = rec_table.to(torch.int32)
                accepted = num_accepted_tokens.index_select(0, rows).to(torch.int32)
                accepted_in_op = all(n == self.num_spec + 1 for n in spans.rec_lens)
        if spans.pre_rows:
            rows = _to_device(list(spans.pre_rows), torch.int64, device)
            prefill = _span(spans.pre_rows, spans.pre_lens, spans.pre_has_state,
                            table.index_select(0, rows), device, per_token_column=False)
        order = (None if spans.token_order is None
                 else _to_device(list(spans.token_order), torch.int64, device))
        return GdnMetadata(kind=spans.kind, num_actual_tokens=cam.num_actual_tokens,
                           recurrent=recurrent, prefill=prefill, speculative=spans.speculative,
                           spec_slot_table=spec_table, num_accepted_tokens=accepted,
                           accepted_in_op=accepted_in_op, token_order=order)

    def build_for_cudagraph_capture(self, common_attn_metadata):
        raise GdnBatchError("the plugin's GDN layers run eager (no graph capture)")
