"""The NPU model runner: vLLM's V1 GPU model runner on an Ascend NPU.

Built by ``AscendNPUWorker`` after it has routed ``torch.cuda``'s stream, event and
graph names to ``torch.npu`` (``worker/npu_device.py``), so the inherited runner's
streams, events and graph capture (the platform's ``AscendNPUGraphWrapper`` over
``torch.npu.graph``, which updates FIA's graph tasks before every replay) are the NPU's.
KV-cache allocation stays vLLM's: the FIA backend reads its K and V as contiguous plane
views of vLLM's blocks (``attention/kv_layout.py``) and SFA's three caches are separate
cache layers, so no NPU kernel needs a layout vLLM does not give.

What it changes: new KV blocks of hybrid models are zeroed by slicing
(``worker/kv_zeroing.py``) instead of vLLM's Triton zeroing kernel; a seeded request
whose partial-prefill sample is discarded gets its generator's offset back exactly
(``worker/seeded_draws.py``); hybrid prefix caching's state copies run on host-staged
addresses and block ids (``worker/mamba_state_copy.py``); vLLM's runner wraps
the model for FULL graphs in ``CUDAGraphWrapper`` itself (not through the platform's
wrapper class); ``load_model`` re-wraps that model in ``AscendNPUGraphWrapper``, which
updates FIA's graph tasks before every replay. With speculative decoding it counts the
accepted drafts per position on the device (``worker/spec_acceptance.py``), logged at
shutdown. The sampler filters top-k / top-p with ``npu_top_k_top_p`` where it applies
(``worker/npu_sampler.py``), never with vLLM's Triton filter.
"""

from __future__ import annotations

from vllm.compilation.cuda_graph import CUDAGraphWrapper
from vllm.config import CUDAGraphMode
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from vllm_ascend_ext.worker import seeded_draws
from vllm_ascend_ext.worker.kv_zeroing import zero_blocks
from vllm_ascend_ext.worker.mamba_state_copy import align_mode_buffers
from vllm_ascend_ext.worker.npu_graph import AscendNPUGraphWrapper
from vllm_ascend_ext.worker.npu_sampler import NpuTopKTopP, host_top_k_max
from vllm_ascend_ext.worker.spec_acceptance import SpecAcceptance


class AscendNPUModelRunner(GPUModelRunner):
    """vLLM's V1 GPU model runner on an Ascend NPU (see module docstring)."""

    def __init__(self, vllm_config, device) -> None:
        super().__init__(vllm_config, device)
        from vllm.platforms import current_platform

        # the plugin's platforms name their SoC; elsewhere (a unit test's) the filter is vLLM's
        soc = getattr(type(current_platform), "soc", None)
        self.sampler.topk_topp_sampler = NpuTopKTopP(self.sampler.topk_topp_sampler,
                                                     soc().family if soc else "")

    def load_model(self, *args, **kwargs) -> None:
        super().load_model(*args, **kwargs)
        self.model = npu_full_graph_wrapper(self.model, self.vllm_config)

    def sample_tokens(self, grammar_output):
        # Seeded requests whose sample vLLM discards get their generator back exactly
        # (worker/seeded_draws.py); vLLM's own rewind assumes CUDA's Philox step.
        stepped = self.execute_model_state is not None
        before = seeded_draws.offsets(self.input_batch.generators) if stepped else {}
        output = super().sample_tokens(grammar_output)
        if before:
            seeded_draws.restore(self.input_batch.generators, before,
                                 self.discard_request_mask.np[:self.input_batch.num_reqs])
        return output

    def _sample(self, logits, spec_decode_metadata):
        # The step's largest top-k, from the host (worker/npu_sampler.py); acceptance per
        # draft position, counted on the device (worker/spec_acceptance.py)
        self.sampler.topk_topp_sampler.host_top_k_max = host_top_k_max(self.input_batch)
        output = super()._sample(logits, spec_decode_metadata)
        if spec_decode_metadata is not None:
            self.spec_acceptance().record(output.sampled_token_ids,
                                          spec_decode_metadata.num_draft_tokens)
        return output

    def _dummy_sampler_run(self, hidden_states):
        # vLLM's warm-up samples with top-k = vocab - 1 for every dummy request
        sampler = self.sampler.topk_topp_sampler
        sampler.host_top_k_max = self.model_config.get_vocab_size() - 1
        try:
            return super()._dummy_sampler_run(hidden_states)
        finally:
            sampler.host_top_k_max = None

    def spec_acceptance(self) -> SpecAcceptance | None:
        """This runner's acceptance counter (None without speculative decoding)."""
        spec = self.speculative_config
        if spec is None:
            return None
        if getattr(self, "_spec_acceptance", None) is None:
            self._spec_acceptance = SpecAcceptance(str(spec.method),
                                                   int(spec.num_speculative_tokens or 0))
        return self._spec_acceptance

    def _get_mamba_bufs(self):
        # Align mode (hybrid prefix caching): vLLM's state copies take raw device
        # addresses in Triton; the NPU's copies take host-staged addresses and block ids
        # (worker/mamba_state_copy.py, worker/mamba_spec_copies.py).
        if self._mamba_bufs is None:
            self._mamba_bufs = align_mode_buffers(self)
        return self._mamba_bufs

    def _init_kv_zero_meta(self) -> None:
        # vLLM's zeroer precomputes raw addresses for its Triton kernel; not used here.
        return None

    def _zero_block_ids(self, block_ids: list[int]) -> None:
        # vLLM's zeroer launches a Triton kernel on raw addresses; the NPU zeroes every
        # kernel block of each new block by slicing (worker/kv_zeroing.py).
        zero_blocks(self, block_ids)


def npu_full_graph_wrapper(model, vllm_config):
    """``model`` with vLLM's FULL ``CUDAGraphWrapper`` (if any) replaced by the NPU's."""
    if (type(model) is CUDAGraphWrapper and model.runtime_mode == CUDAGraphMode.FULL):
        return AscendNPUGraphWrapper(model.runnable, vllm_config,
                                     runtime_mode=CUDAGraphMode.FULL,
                                     cudagraph_options=model.cudagraph_options)
    return model
