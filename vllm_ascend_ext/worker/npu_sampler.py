"""The NPU runner's top-k / top-p filter: ``torch_npu.npu_top_k_top_p`` where it applies.

vLLM's sampler filters the logits with ``apply_top_k_top_p``, which takes vLLM's Triton
kernel wherever Triton is importable (``HAS_TRITON``: triton-ascend on an Atlas host).
That kernel asks the platform for its compute units and is not written for Ascend's
Triton backend; vllm-ascend filters with ``npu_top_k_top_p`` instead. So does this runner:
``NpuTopKTopP`` wraps the sampler vLLM built and filters before it, then hands vLLM's
sampler the filtered logits with no top-k / top-p left to apply, so vLLM's own draw
(its platform's choice: exponential noise on an NPU) runs unchanged.

The operator applies (``fused_filter_applies``, pure) where its documentation allows it:
the SoC family lists it (A2, A3; not Ascend 950), and every request's top-k is in
``[1, 1024]``, known on the host from the runner's input batch before the step (a request
without top-k has ``k = vocab``). Elsewhere vLLM's PyTorch filter runs (the same
threshold semantics, no Triton, no host read). The rejection sampler's filter (vLLM's
module-level ``apply_top_k_top_p``, speculative decoding) is not this one, and it still
takes vLLM's Triton kernel where Triton imports: vLLM's kernel-override registry cannot
take that kernel (its launch passes ``num_warps``, which ``KernelOverride`` refuses).
"""

from __future__ import annotations

import torch
from torch import nn
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

from vllm_ascend_ext.ops.top_k_top_p import MAX_K, npu_top_k_top_p

FAMILIES = ("A2", "A3")  # npu_top_k_top_p's documented products


def fused_filter_applies(family: str, vocab: int, host_top_k_max: int | None,
                         has_top_k: bool) -> bool:
    """``npu_top_k_top_p`` for this step: the SoC lists it and, when the step filters by
    top-k, the largest ``k`` (read on the host) is within the operator's ``[1, 1024]`` and
    the vocabulary. An unknown ``k`` (no host value) takes vLLM's filter."""
    if family not in FAMILIES:
        return False
    if not has_top_k:
        return True
    return host_top_k_max is not None and 1 <= host_top_k_max <= min(MAX_K, vocab)


def filter_logits(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None,
                  fused: bool) -> torch.Tensor:
    """The logits with top-k then top-p applied (``-inf`` where filtered)."""
    if k is None and p is None:
        return logits
    if not fused:
        return apply_top_k_top_p_pytorch(logits, k, p)
    return npu_top_k_top_p(logits, None if p is None else p.to(logits.dtype),
                           None if k is None else k.to(torch.int32))


class NpuTopKTopP(nn.Module):
    """vLLM's ``TopKTopPSampler`` with the NPU's filter in front (module docstring)."""

    def __init__(self, inner: nn.Module, family: str) -> None:
        super().__init__()
        self.inner = inner
        self.family = family
        self.logprobs_mode = getattr(inner, "logprobs_mode", None)
        # the largest top-k of the step's requests, set by the runner before sampling
        self.host_top_k_max: int | None = None
        self.fused_calls = 0  # steps filtered by npu_top_k_top_p (reported, tested)

    def forward(self, logits: torch.Tensor, generators: dict[int, torch.Generator],
                k: torch.Tensor | None, p: torch.Tensor | None):
        if k is not None or p is not None:
            fused = fused_filter_applies(self.family, logits.shape[-1], self.host_top_k_max,
                                         k is not None)
            logits = filter_logits(logits, k, p, fused)
            self.fused_calls += int(fused)
        return self.inner(logits, generators, None, None)


def host_top_k_max(input_batch) -> int | None:
    """The largest top-k of the batch's requests, from the input batch's host copy (None
    when no request filters by top-k or the batch is empty)."""
    n = input_batch.num_reqs
    if not n or input_batch.no_top_k:
        return None
    return int(input_batch.top_k_cpu[:n].max())
