"""The NPU runner's state copies for vLLM's "align" mamba cache mode (hybrid prefix caching).

In align mode a request's linear-attention state (GDN: a conv state and a recurrent state
per layer) lives in the slot of the block that holds its last computed token; when a step
moves it past a block boundary, vLLM's runner first copies the state into the new block's
slot and leaves the old block's slot as that block's checkpoint, which a later request
whose prefix hits the block resumes from (``vllm/v1/worker/mamba_utils.py``). vLLM does the
copies with Triton kernels on raw device addresses. The NPU runner does them with torch
copies whose addresses and block ids are **host values the runner itself staged** this
step, so nothing is read back from the device:

* without speculation, ``preprocess_mamba`` collects (source address, destination
  address, bytes) triples in numpy and hands them to ``batch_memcpy_kernel``. The NPU
  runner keeps those buffers on the host (``host_buffer``), and the kernel's substitute
  (``batch_memcpy``) turns each address into a slice of the device allocation holding it
  (``StateMemory``) and copies the slice;
* with speculation, vLLM's fused pre-copy and post-copy kernels run as the methods of
  ``worker/mamba_spec_copies.AlignSpecCopies``.

One engine runner per process registers its allocations (``register_state_memory``);
the substitute refuses addresses outside them, and device-resident address tensors (a
host read each step), with a message instead of copying wrong bytes.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

import torch

from vllm_ascend_ext.errors import AscendExtError

BATCH_MEMCPY = "vllm.v1.worker.mamba_utils.batch_memcpy_kernel"


class StateMemory:
    """The device allocations (untyped storages) behind a runner's mamba state tensors,
    each as a flat byte tensor, looked up by address on the host."""

    def __init__(self, states: Iterable[torch.Tensor]):
        raws: dict[int, torch.Tensor] = {}
        for state in states:
            storage = state.untyped_storage()
            base = storage.data_ptr()
            if base not in raws:
                raws[base] = torch.empty(0, dtype=torch.uint8, device=state.device).set_(
                    storage, 0, (storage.nbytes(),))
        self._bases = sorted(raws)
        self._raws = [raws[b] for b in self._bases]

    def __len__(self) -> int:
        return len(self._bases)

    def locate(self, address: int, size: int) -> tuple[int, torch.Tensor]:
        """(allocation index, the ``size`` bytes at ``address`` as a uint8 view)."""
        i = bisect.bisect_right(self._bases, address) - 1
        if i < 0 or address + size > self._bases[i] + self._raws[i].numel() or size < 0:
            raise AscendExtError(
                f"mamba state copy: {size} bytes at address {address:#x} lie outside the "
                f"runner's {len(self)} registered state allocation(s)")
        offset = address - self._bases[i]
        return i, self._raws[i][offset:offset + size]


_memory: StateMemory | None = None


def register_state_memory(states: Iterable[torch.Tensor]) -> StateMemory:
    """Make ``states``' allocations the ones ``batch_memcpy`` copies within (this
    process's engine runner, once its KV cache exists)."""
    global _memory
    _memory = StateMemory(states)
    return _memory


def batch_memcpy(src_ptrs: torch.Tensor, dst_ptrs: torch.Tensor, sizes: torch.Tensor,
                 BLOCK_SIZE: int | None = None) -> None:  # noqa: N803
    """``mamba_utils.batch_memcpy_kernel``: copy ``sizes[i]`` bytes from ``src_ptrs[i]``
    to ``dst_ptrs[i]``, in order. The three tensors must be host tensors (the NPU runner
    stages them on the host); a destination overlapping its own source reads the source
    as it was before the copy, as the kernel does."""
    for name, t in (("src_ptrs", src_ptrs), ("dst_ptrs", dst_ptrs), ("sizes", sizes)):
        if t.device.type != "cpu":
            raise AscendExtError(
                f"mamba state copy: {name} is on {t.device}; the NPU runner stages the "
                "copy addresses on the host (reading them from the device would be a host "
                "sync per step)")
    if _memory is None:
        raise AscendExtError("mamba state copy: no state allocations registered (only the "
                             "plugin's NPU runner issues align-mode state copies)")
    for src, dst, size in zip(src_ptrs.numpy().tolist(), dst_ptrs.numpy().tolist(),
                              sizes.numpy().tolist()):
        si, source = _memory.locate(int(src), int(size))
        di, target = _memory.locate(int(dst), int(size))
        if si == di and abs(int(src) - int(dst)) < size and src != dst:
            source = source.clone()
        if src != dst:
            target.copy_(source)


def host_buffer(*size: int, dtype: torch.dtype):
    """A ``CpuGpuBuffer`` whose "device" side is its host side: the values vLLM's runner
    stages for its state copies are consumed on the host (``batch_memcpy``,
    ``AlignSpecCopies``), so ``copy_to_gpu`` copies nothing and pins nothing."""
    from vllm.v1.utils import CpuGpuBuffer

    class HostBuffer(CpuGpuBuffer):
        def copy_to_gpu(self, n: int | None = None) -> torch.Tensor:
            return self.cpu if n is None else self.cpu[:n]

    buf = HostBuffer(*size, dtype=dtype, device=torch.device("cpu"), pin_memory=False)
    buf.gpu = buf.cpu
    return buf


def mamba_states(kv_cache_config, forward_context) -> list[torch.Tensor]:
    """Every mamba layer's state tensors, in vLLM's copy order (group, layer, state)."""
    from vllm.v1.worker.mamba_utils import get_mamba_group_ids, get_mamba_groups

    states = []
    for gid in get_mamba_group_ids(get_mamba_groups(kv_cache_config)):
        for name in kv_cache_config.kv_cache_groups[gid].layer_names:
            states.extend(forward_context[name].kv_cache)
    return states


def align_mode_buffers(runner):
    """The NPU runner's ``MambaBuffers`` for align mode: the address lists on the host,
    the runner's state allocations registered for ``batch_memcpy``, and with speculation
    the fused copies as ``AlignSpecCopies`` over the runner's host block tables."""
    from vllm.v1.worker.mamba_utils import MambaBuffers, MambaCopyBuffers

    from vllm_ascend_ext.worker.mamba_spec_copies import AlignSpecCopies

    copy_funcs = runner._get_mamba_state_copy_funcs()
    config = runner.kv_cache_config
    register_state_memory(mamba_states(config, runner.compilation_config.static_forward_context))
    spec = None
    if runner.speculative_config is not None and runner.model_config.is_hybrid:
        spec = AlignSpecCopies.create(runner.max_num_reqs, config, copy_funcs, runner.device,
                                      host_buffer)
        groups = spec.mamba_group_ids
        spec.host_tables = lambda: [runner.input_batch.block_table[g].get_numpy_array()
                                    for g in groups]
    return MambaBuffers(preprocess=MambaCopyBuffers.create(runner.max_num_reqs, config,
                                                           copy_funcs, host_buffer),
                        postprocess_align=spec)
