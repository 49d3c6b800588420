"""The Gated-DeltaNet gates and the q/k normalisation: documented composites (ATen ops).

torch_npu 2.13 has no fused op for these; they are elementwise, so the plugin computes
them in float32 (float64 for float64 inputs) with plain ATen ops, as Qwen3-Next's and
Qwen3.5's reference implementation (Hugging Face transformers) does::

    g    = -exp(A_log) * softplus(a + dt_bias)      (T, Nv), float32: log of the decay
    beta = sigmoid(b)                                (T, Nv), in b's dtype
    l2norm(x) = x / sqrt(sum(x^2) + 1e-6)            over the head dim, in x's dtype
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vllm_ascend_ext.ops.gdn_recurrent import work_dtype

L2NORM_EPS = 1e-6
SOFTPLUS_THRESHOLD = 20.0


def gdn_gates(a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor,
              dt_bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    w = work_dtype(a)
    g = -torch.exp(a_log.to(w)) * F.softplus(a.to(w) + dt_bias.to(w),
                                              threshold=SOFTPLUS_THRESHOLD)
    return g, torch.sigmoid(b.to(w)).to(b.dtype)


def l2norm(x: torch.Tensor) -> torch.Tensor:
    w = work_dtype(x)
    xw = x.to(w)
    return (xw * torch.rsqrt((xw * xw).sum(-1, keepdim=True) + L2NORM_EPS)).to(x.dtype)
