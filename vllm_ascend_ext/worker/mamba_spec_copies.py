"""vLLM's fused align-mode state copies under speculative decoding, as torch on the NPU.

With speculation, vLLM's runner replaces ``preprocess_mamba``'s address list by two fused
Triton kernels (``vllm/v1/worker/mamba_utils.py``), driven by a
``MambaSpecDecodeGPUContext``:

* the **pre-copy** (before the forward): a request whose running state moves to a new
  block column copies ``state[bt[src], bias:] -> state[bt[dst], :W - bias]`` (conv
  states, ``W`` the window) and ``state[bt[src + bias]] -> state[bt[dst]]`` (recurrent
  states), ``bias`` the accepted-token offset of the previous step;
* the **post-copy** (after sampling): when the accepted tokens end a block, the state at
  the block's end is copied into that block's slot (its checkpoint), and a request whose
  state stayed in its column reads it with the neutral offset next step.

``AlignSpecCopies`` is that context with both kernels as torch index ops. The pre-copy's
inputs are host values ``preprocess_mamba`` staged this step; the post-copy depends on the
accepted counts, which stay on the device: the host only narrows the rows to those whose
block boundary lies within reach of their drafts (an accepted prefix can end a block only
there), and the device chooses per row, by the accepted count, between the copy and an
identity write. Block ids come from the runner's host block tables. No host read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from vllm.model_executor.layers.mamba.mamba_utils import (
    get_conv_copy_spec,
    get_temporal_copy_spec,
    is_conv_state_dim_first,
)
from vllm.v1.worker.mamba_utils import MambaSpecDecodeGPUContext, _get_mamba_spec_for_layer

from vllm_ascend_ext.errors import AscendExtError


def _h2d(values, device: torch.device) -> torch.Tensor:
    host = torch.as_tensor(np.asarray(values, dtype=np.int64))
    if device.type in ("cpu", "meta"):
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def copy_state_blocks(states: list[tuple[torch.Tensor, bool]], table: torch.Tensor,
                      src_col: torch.Tensor, dst_col: torch.Tensor, bias: torch.Tensor,
                      need: torch.Tensor) -> None:
    """For each row ``r`` with ``need[r]`` (device values, ``[C]``): conv states
    ``S[t[src], bias:] -> S[t[dst], :W - bias]``, recurrent states
    ``S[t[src + bias]] -> S[t[dst]]``, ``t = table[r]`` (``[C, cols]``, int64 block ids).
    Rows without ``need`` write their own source block onto itself."""
    bias = torch.where(need, bias, torch.zeros_like(bias))
    own = table.gather(1, src_col.unsqueeze(1)).squeeze(1)
    dst = torch.where(need, table.gather(1, dst_col.unsqueeze(1)).squeeze(1), own)
    shifted_src = torch.where(need, table.gather(1, (src_col + bias).unsqueeze(1)).squeeze(1),
                              own)
    for state, conv in states:
        if not conv:
            state.index_copy_(0, dst, state.index_select(0, shifted_src))
            continue
        view = state.transpose(1, 2) if is_conv_state_dim_first() else state  # [N, W, D]
        width = view.shape[1]
        t = torch.arange(width, device=bias.device).unsqueeze(0)          # [1, W]
        take = (t + bias.unsqueeze(1)).clamp(max=width - 1)               # [C, W]
        moved = view.index_select(0, own).gather(
            1, take.unsqueeze(-1).expand(-1, -1, view.shape[2]))
        kept = view.index_select(0, dst)
        tail = (t >= width - bias.unsqueeze(1)).unsqueeze(-1)
        view.index_copy_(0, dst, torch.where(tail, kept, moved))


@dataclass
class AlignSpecCopies(MambaSpecDecodeGPUContext):
    """``MambaSpecDecodeGPUContext`` whose pre- and post-copies are torch index ops (see
    module docstring). ``host_tables`` returns the runner's host block tables, one per
    mamba group in ``mamba_group_ids`` order."""

    host_tables: Callable[[], list[np.ndarray]] | None = None
    states: list[tuple[torch.Tensor, bool]] = field(default_factory=list)
    state_groups: list[int] = field(default_factory=list)

    def initialize_from_forward_context(self, kv_cache_config, forward_context,
                                        mamba_state_copy_funcs, block_tables,
                                        aligned_index_block_tables=None) -> None:
        if self.is_initialized:
            return
        for local, gid in enumerate(self.mamba_group_ids):
            group = kv_cache_config.kv_cache_groups[gid]
            for name in group.layer_names:
                spec = _get_mamba_spec_for_layer(group, name)
                funcs = mamba_state_copy_funcs[spec.mamba_type]
                states = forward_context[name].kv_cache
                if len(states) < len(funcs) or any(
                        f not in (get_conv_copy_spec, get_temporal_copy_spec) for f in funcs):
                    raise AscendExtError(
                        f"align-mode state copies: layer {name} has {len(states)} state "
                        f"tensors for copy functions {[f.__name__ for f in funcs]}; only "
                        "vLLM's conv and temporal copies are served")
                for state, func in zip(states, funcs):
                    self.states.append((state, func is get_conv_copy_spec))
                    self.state_groups.append(local)
        self.is_initialized = True

    def _copy(self, rows: list[int], src_col, dst_col, bias, need, width: int) -> None:
        device = self.num_accepted_tokens_out.device
        tables = self.host_tables()
        for local in range(self.num_groups):
            table = _h2d(tables[local][rows, :width], device)
            copy_state_blocks([s for s, g in zip(self.states, self.state_groups) if g == local],
                              table, src_col, dst_col, bias, need)

    def run_fused_precopy(self, num_reqs: int, state_idx_gpu, src_col_gpu, token_bias_gpu,
                          idx_mapping=None) -> None:
        if num_reqs == 0 or not self.is_initialized:
            return
        if idx_mapping is not None:
            raise NotImplementedError("AlignSpecCopies serves vLLM's V1 runner (batch order)")
        dst = self.mamba_state_idx_buf.np[:num_reqs]
        src = self.precopy_src_col_buf.np[:num_reqs]
        bias = self.precopy_token_bias_buf.np[:num_reqs]
        rows = [r for r in range(num_reqs) if src[r] >= 0 and src[r] != dst[r]]
        if not rows:
            return
        device = self.num_accepted_tokens_out.device
        width = int(max(max(src[r] + bias[r], dst[r]) for r in rows)) + 1
        self._copy(rows, _h2d(src[rows], device), _h2d(dst[rows], device),
                   _h2d(bias[rows], device), torch.ones(len(rows), dtype=torch.bool,
                                                        device=device), width)

    def run_fused_postprocess(self, num_reqs: int, num_accepted_tokens_gpu, mamba_state_idx_gpu,
                              num_scheduled_tokens_gpu, num_computed_tokens_gpu,
                              num_draft_tokens_gpu) -> None:
        if num_reqs == 0 or not self.is_initialized:
            return
        out = self.num_accepted_tokens_out
        out[:num_reqs].copy_(num_accepted_tokens_gpu[:num_reqs])
        size = self.block_size
        src = self.mamba_state_idx_buf.np[:num_reqs].astype(np.int64)
        running = (self.num_computed_tokens_buf.np[:num_reqs].astype(np.int64)
                   + self.num_scheduled_tokens_buf.np[:num_reqs]
                   - self.num_draft_tokens_buf.np[:num_reqs])
        reach = running + self.num_draft_tokens_buf.np[:num_reqs]
        # accepted in [1, drafts + 1]: a block can end inside the accepted prefix only if a
        # multiple of the block size lies in [running, running + drafts].
        rows = [r for r in range(num_reqs) if (reach[r] // size) * size >= running[r]]
        if not rows:
            return
        device = out.device
        index = _h2d(rows, device)
        accepted = num_accepted_tokens_gpu.index_select(0, index).to(torch.int64)
        run = _h2d(running[rows], device)
        src_col = _h2d(src[rows], device)
        aligned = torch.div(run + accepted - 1, size, rounding_mode="floor") * size
        need = aligned >= run
        dst_col = torch.where(need, torch.div(aligned, size, rounding_mode="floor") - 1,
                              src_col)
        bias = aligned - run
        width = int(max(max(src[r] + (reach[r] - running[r]),
                            reach[r] // size - 1) for r in rows)) + 1
        self._copy(rows, src_col, dst_col, bias, need, width)
        reset = need & (src_col == dst_col)
        out.index_copy_(0, index, torch.where(reset, torch.ones_like(accepted),
                                              accepted).to(out.dtype))
