"""Metadata builder of the FIA backend: all per-step work, once per step.

Host lists come from host copies only (``query_start_loc_cpu``,
``seq_lens_cpu_upper_bound``), never from a device read; block ids and the slot
mapping become the int32 *plane* ids and slots that the contiguous K and V views take
(``attention/kv_layout.py``) here, once, shared by every layer. Every step leaves
here as a tuple of spans, one FIA call each (``split.step_spans``): mixed steps
(decodes beside a prefill chunk) get their boundary and the gate's decision here, and
two spans when the gate splits; the forward loops over the spans.
"""

from __future__ import annotations

import weakref
from typing import ClassVar

import torch
from vllm.v1.attention.backend import (
    AttentionCGSupport,
    AttentionMetadataBuilder,
    CommonAttentionMetadata,
)
from vllm.v1.attention.backends.utils import split_decodes_and_prefills

from vllm_ascend_ext.attention.fia import graph_tasks
from vllm_ascend_ext.attention.fia.gate import LayerTraits, decide
from vllm_ascend_ext.attention.fia.metadata import AscendFIAMetadata
from vllm_ascend_ext.attention.fia.plan import BatchMetadataError, host_lists
from vllm_ascend_ext.attention.fia.split import (
    Boundary,
    check_against_vllm,
    find_boundary,
    step_spans,
)
from vllm_ascend_ext.attention.fia.stats import SplitStats
from vllm_ascend_ext.attention.kv_layout import plane_block_table, plane_slots, spec_plane_factor


def _layer_traits(vllm_config, layer_names, kv_cache_spec) -> LayerTraits:
    from vllm.config import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention import Attention

    layers = get_layers_from_vllm_config(vllm_config, Attention, layer_names)
    impl = next(iter(layers.values())).impl if layers else None
    return LayerTraits(
        head_dim=kv_cache_spec.head_size,
        local_q_heads=getattr(impl, "num_heads", kv_cache_spec.num_kv_heads),
        local_kv_heads=kv_cache_spec.num_kv_heads,
    )


class AscendFIAMetadataBuilder(AttentionMetadataBuilder[AscendFIAMetadata]):
    # Decode-only (uniform) batches may be captured; mixed steps always run eager,
    # so a replay can never rewrite a split step. FIA's host lists are fixed at
    # capture: on the NPU each captured FIA call is a graph task whose host lists the
    # runner updates on every replay (graph_tasks.py).
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device, *, traits=None,
                 mode=None, soc_family=None, batch_invariant=None, tasks=None):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.block_size = kv_cache_spec.block_size
        self.plane_factor = spec_plane_factor(kv_cache_spec)
        if vllm_config is not None:
            from vllm import envs
            from vllm.platforms import current_platform

            from vllm_ascend_ext.config import get_config

            self._init_reorder_batch_threshold(1, supports_spec_as_decode=True)
            mode = mode or get_config(vllm_config).mixed_split
            soc_family = soc_family or current_platform.soc().family
            batch_invariant = (envs.VLLM_BATCH_INVARIANT if batch_invariant is None
                               else batch_invariant)
            traits = traits or _layer_traits(vllm_config, layer_names, kv_cache_spec)
        else:  # standalone use (tests, tools): everything passed explicitly
            self.reorder_batch_threshold = 1
        self.mode = mode or "auto"
        self.soc_family = soc_family or "A2"
        self.batch_invariant = bool(batch_invariant)
        self.traits = traits or LayerTraits(kv_cache_spec.head_size, 1, 1)
        # Decode graphs (NPU): FIA graph tasks, and persistent buffers for the device
        # tensors a captured graph reads (``tasks``: a stand-in, for tests).
        self.graph_tasks = tasks or graph_tasks.for_device(vllm_config, device)
        self.buffers = None
        if self.graph_tasks is not None:
            sched = getattr(vllm_config, "scheduler_config", None)
            self.buffers = StepBuffers(getattr(sched, "max_num_seqs", 0),
                                       getattr(sched, "max_num_batched_tokens", 0))
        self.stats = SplitStats(",".join(layer_names[:1]) + ("..." if len(layer_names) > 1 else ""))
        weakref.finalize(self, self.stats.log_final)

    def log_final_summary(self) -> None:
        """Called by the plugin's worker at shutdown (see worker/orderly_stop.py)."""
        self.stats.log_final()

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> AscendFIAMetadata:
        cam = common_attn_metadata
        if cam.seq_lens_cpu_upper_bound is None:
            raise BatchMetadataError(
                "CommonAttentionMetadata.seq_lens_cpu_upper_bound is missing: the FIA "
                "backend needs host sequence lengths and never reads them from the device"
            )
        num_reqs = cam.num_reqs
        cu_q, kv_lens = host_lists(
            cam.query_start_loc_cpu[: num_reqs + 1].tolist(),
            cam.seq_lens_cpu_upper_bound[:num_reqs].tolist(),
            cam.num_actual_tokens,
        )
        num_tokens = cu_q[-1] if cu_q else 0
        block_table = plane_block_table(cam.block_table_tensor[:num_reqs], self.plane_factor)
        slots = plane_slots(cam.slot_mapping, self.block_size, self.plane_factor)
        if self.buffers is not None:
            # A captured graph reads these addresses on every replay: this step's values
            # go into the same buffers (runner padding included: null slots, null block).
            block_table, slots = self.buffers.write(block_table, slots)
        causal = cam.causal
        if not isinstance(causal, bool):
            raise BatchMetadataError(
                "per-request causal flags (tensor) are not supported by the FIA backend"
            )
        # One FIA call per span: the whole step, or (decode, prefill) when split.
        spans = step_spans(cu_q, kv_lens, self._split_at(cam, cu_q, num_tokens))
        return AscendFIAMetadata(
            num_actual_tokens=num_tokens,
            num_reqs=num_reqs,
            max_query_len=cam.max_query_len,
            max_seq_len=cam.max_seq_len,
            causal=causal,
            block_table=block_table,
            slot_indices=slots[:num_tokens],
            plane_factor=self.plane_factor,
            actual_seq_lengths_q=cu_q,
            actual_seq_lengths_kv=kv_lens,
            spans=spans,
            graph_tasks=self.graph_tasks,
        )

    def _split_at(self, cam: CommonAttentionMetadata, cu_q: tuple[int, ...],
                  num_tokens: int) -> Boundary | None:
        """The decode/prefill boundary when this step is mixed and the gate splits it,
        else None (one FIA call). Mixed steps are checked against vLLM's own count and
        counted in the split statistics."""
        threshold = self.reorder_batch_threshold or 1
        boundary = find_boundary(cu_q, threshold)
        if not boundary.mixed:
            return None
        check_against_vllm(boundary, split_decodes_and_prefills(cam, threshold),
                           cam.num_actual_tokens - num_tokens)
        decision = decide(self.mode, self.soc_family, self.traits,
                          batch_invariant=self.batch_invariant,
                          num_decodes=boundary.num_decodes,
                          num_prefills=boundary.num_prefills)
        self.stats.record(decision.split, decision.reason)
        self.stats.maybe_log()
        return boundary if decision.split else None


class StepBuffers:
    """Persistent device buffers a step's plane block table and slots are written into
    (decode graphs only): a replayed graph reads the addresses it was captured with.
    Sized from the scheduler's limits when known, so no later step reallocates them."""

    def __init__(self, max_reqs: int = 0, max_tokens: int = 0):
        self.max_reqs, self.max_tokens = max_reqs, max_tokens
        self.table: torch.Tensor | None = None
        self.slots: torch.Tensor | None = None

    def write(self, table: torch.Tensor, slots: torch.Tensor):
        n, width = table.shape
        if self.table is None or self.table.shape[0] < n or self.table.shape[1] != width:
            self.table = table.new_zeros(max(n, self.max_reqs), width)
        if self.slots is None or self.slots.shape[0] < slots.shape[0]:
            self.slots = slots.new_zeros(max(slots.shape[0], self.max_tokens))
        self.table[:n].copy_(table)
        self.slots[:slots.shape[0]].copy_(slots)
        return self.table[:n], self.slots[:slots.shape[0]]
