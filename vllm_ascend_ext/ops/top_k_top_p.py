"""``torch_npu.npu_top_k_top_p(logits, p=None, k=None) -> Tensor``: the sampler's filter.

torch-npu 2.13's schema takes ``p`` and ``k`` optional (not both None); its documentation
(A2 and A3 only) gives the computation step by step, which the reference follows:

1. sort each row ascending, stable: ``sortedValue, sortedIndices``;
2. top-k: the threshold is ``sortedValue[b][V - k[b]]`` (the k-th largest); values
   strictly below it become ``-inf`` (ties at the threshold all stay);
3. top-p on what top-k kept: ``softmax`` of the sorted row, cumulative sum from the
   smallest probability; positions whose cumulative sum is ``<= 1 - p[b]`` become
   ``-inf``, the largest always stays;
4. the row back in its original order.

``k`` is int32 in ``[1, 1024]`` and at most the vocabulary; ``p`` is in ``[0, 1]`` with the
logits' dtype (contract mode checks both: ``contract/layer_op_rules.py``). The softmax and
cumulative sum run in float32 here; the documentation does not name the kernel's
accumulation dtype.
"""

from __future__ import annotations

import torch

from vllm_ascend_ext.ops._dispatch import torch_npu_module
from vllm_ascend_ext.ops.counting import npu_op
from vllm_ascend_ext.ops.op_record import NpuOp

OP = "npu_top_k_top_p"
MAX_K = 1024  # the documented range of k is [1, 1024]


def _check(logits: torch.Tensor, p, k) -> None:
    if p is None and k is None:
        raise ValueError("npu_top_k_top_p: p and k cannot both be None")
    if logits.dim() != 2:
        raise ValueError(f"npu_top_k_top_p: logits must be 2-D, got {tuple(logits.shape)}")
    for name, t in (("p", p), ("k", k)):
        if t is not None and tuple(t.shape) != (logits.shape[0],):
            raise ValueError(f"npu_top_k_top_p: {name} {tuple(t.shape)} must be 1-D of the "
                             f"logits' batch {logits.shape[0]}")


def top_k_top_p_reference(logits: torch.Tensor, p: torch.Tensor | None = None,
                          k: torch.Tensor | None = None) -> torch.Tensor:
    _check(logits, p, k)
    values, indices = logits.sort(dim=-1, descending=False, stable=True)
    vocab = values.shape[-1]
    if k is not None:
        at = (vocab - k.to(torch.long)).clamp(0, vocab - 1).unsqueeze(1)
        values = values.masked_fill(values < values.gather(1, at), float("-inf"))
    if p is not None:
        cum = values.float().softmax(dim=-1).cumsum(dim=-1)
        drop = cum <= 1 - p.float().unsqueeze(1)
        drop[:, -1] = False
        values = values.masked_fill(drop, float("-inf"))
    return torch.empty_like(values).scatter_(-1, indices, values)


def top_k_top_p_meta(logits, p=None, k=None):
    _check(logits, p, k)
    return torch.empty_like(logits)


def top_k_top_p_npu(logits, p=None, k=None):
    return torch_npu_module().npu_top_k_top_p(logits, p=p, k=k)


@npu_op(OP)
def npu_top_k_top_p(logits: torch.Tensor, p: torch.Tensor | None = None,
                    k: torch.Tensor | None = None) -> torch.Tensor:
    return TOP_K_TOP_P.pick(logits.device)(logits, p, k)


TOP_K_TOP_P = NpuOp(OP, npu=top_k_top_p_npu, reference=top_k_top_p_reference,
                    meta=top_k_top_p_meta, rules="LAYER_OP_RULES")
