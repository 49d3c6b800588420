"""``torch_npu.npu_interleave_rope`` and the RoPE convention it shares with the MLA ops.

Semantics (``docs/npu-ops.md`` §0.7, §5): the rope vector arrives **interleaved**
(pairs (x0,x1),(x2,x3),...); the op de-interleaves it, applies rotate-half RoPE
with "half-duplicated" cos/sin (``cat([freqs, freqs]).cos()``) and writes the
result in half-split order. The same permutation is applied to query and key, so
dot products equal DeepSeek's interleaved (GPT-J style) RoPE.

``npu_interleave_rope(x, cos, sin)``: x [B,N,S,64], cos/sin [B,1,S|1,64], output
same shape/dtype as x. The emulation accepts any even last dim and fp32.
"""

from __future__ import annotations

import torch

from vllm_ascend_ext.ops._dispatch import torch_npu_module
from vllm_ascend_ext.ops.counting import npu_op
from vllm_ascend_ext.ops.op_record import NpuOp

OP = "npu_interleave_rope"


def deinterleave(x: torch.Tensor) -> torch.Tensor:
    """[x0,x1,x2,x3,...] -> [x0,x2,...,x1,x3,...] along the last dim."""
    d = x.shape[-1]
    return x.reshape(*x.shape[:-1], d // 2, 2).transpose(-1, -2).reshape(x.shape)


def rope_interleave_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """De-interleave, then rotate-half RoPE (fp32 math; returns fp32)."""
    q = deinterleave(x.float())
    h = q.shape[-1] // 2
    rot = torch.cat((-q[..., h:], q[..., :h]), -1)
    return q * cos.float() + rot * sin.float()


def _check(x, cos, sin) -> None:
    if x.dim() != 4 or x.shape[-1] % 2:
        raise ValueError(f"npu_interleave_rope: x must be [B,N,S,D] with even D, got {tuple(x.shape)}")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dim() != 4 or t.shape[1] != 1 or t.shape[-1] != x.shape[-1]:
            raise ValueError(
                f"npu_interleave_rope: {name} must be [B,1,S|1,{x.shape[-1]}], got {tuple(t.shape)}"
            )


def interleave_rope_reference(x, cos, sin):
    _check(x, cos, sin)
    return rope_interleave_half(x, cos, sin).to(x.dtype)


def interleave_rope_meta(x, cos, sin):
    _check(x, cos, sin)
    return torch.empty_like(x)


def interleave_rope_npu(x, cos, sin):
    return torch_npu_module().npu_interleave_rope(x, cos, sin)


@npu_op(OP)
def npu_interleave_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    impl = INTERLEAVE_ROPE.pick(x.device)
    return impl(x, cos, sin)


INTERLEAVE_ROPE = NpuOp(OP, npu=interleave_rope_npu, reference=interleave_rope_reference,
                        meta=interleave_rope_meta)
