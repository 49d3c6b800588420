"""``torch_npu.npu_mrope`` in rope mode: RoPE of query and key in one launch.

``npu_mrope(positions, query, key, cos_sin_cache, head_size, *, mrope_section=None,
rotary_mode='half', cache_mode='default') -> (query_out, key_out)``

Semantics (its torch-npu 2.13 documentation; ``docs/operators.md``): ``positions`` is 1-D
(rope mode; 2-D would be multimodal mrope, which the plugin does not call), ``query``
``[T, Nq * head_size]`` and ``key`` ``[T, Nk * head_size]`` are 2-D, ``cos_sin_cache`` is
``[max_positions, rotary_dim]`` laid out ``cat(cos, sin)`` over ``rotary_dim / 2`` each
(``cache_mode='default'``: vLLM's ``cos_sin_cache``). The op gathers the rows of the
positions itself and rotates the first ``rotary_dim`` elements of every head, passing
the rest through (partial rotary): ``'half'`` is rotate-half (GPT-NeoX), ``'interleave'``
rotates the pairs ``(x0, x1), (x2, x3), ...`` (GPT-J). The reference computes in fp32
and rounds once to the input dtype.
"""

from __future__ import annotations

import torch

from vllm_ascend_ext.ops._dispatch import torch_npu_module
from vllm_ascend_ext.ops.compiled import LAYER_KERNEL_DTYPES, emulation_kernel
from vllm_ascend_ext.ops.counting import npu_op
from vllm_ascend_ext.ops.op_record import NpuOp

OP = "npu_mrope"
KERNEL = "emu_rope"
# float64 stays on the reference, which rounds the pass-through elements through fp32
ROPE_KERNEL_DTYPES = tuple(d for d in LAYER_KERNEL_DTYPES if d != torch.float64)
ROTARY_MODES = ("half", "interleave")


def _check(positions, query, key, cos_sin_cache, head_size, rotary_mode) -> int:
    if positions.dim() != 1:
        raise ValueError(f"npu_mrope: the plugin calls rope mode (1-D positions), got "
                         f"positions {tuple(positions.shape)}")
    for name, t in (("query", query), ("key", key), ("cos_sin_cache", cos_sin_cache)):
        if t.dim() != 2:
            raise ValueError(f"npu_mrope: {name} must be 2-D, got {tuple(t.shape)}")
    tokens = positions.shape[0]
    for name, t in (("query", query), ("key", key)):
        if t.shape[0] != tokens or t.shape[1] % head_size:
            raise ValueError(f"npu_mrope: {name} {tuple(t.shape)} must be [{tokens}, "
                             f"heads * {head_size}]")
    rotary_dim = cos_sin_cache.shape[1]
    if rotary_dim % 2 or rotary_dim > head_size:
        raise ValueError(f"npu_mrope: rotary_dim {rotary_dim} (cos_sin_cache's last dim) "
                         f"must be even and at most head_size {head_size}")
    if rotary_mode not in ROTARY_MODES:
        raise ValueError(f"npu_mrope: rotary_mode {rotary_mode!r}; allowed: {ROTARY_MODES}")
    return rotary_dim


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_mode: str,
           head_size: int) -> torch.Tensor:
    """``x`` [T, N * head_size]; cos/sin [T, rotary_dim / 2] (fp32): rotated in fp32."""
    tokens, half = x.shape[0], cos.shape[1]
    heads = x.view(tokens, -1, head_size).float()
    rot, rest = heads[..., :2 * half], heads[..., 2 * half:]
    c, s = cos[:, None, :], sin[:, None, :]
    if rotary_mode == "half":
        x1, x2 = rot[..., :half], rot[..., half:]
        out = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
    return torch.cat((out, rest), dim=-1).reshape(x.shape)


def mrope_reference(positions, query, key, cos_sin_cache, head_size, *, mrope_section=None,
                    rotary_mode="half", cache_mode="default"):
    _check(positions, query, key, cos_sin_cache, head_size, rotary_mode)
    if mrope_section is not None and any(mrope_section):
        raise ValueError(f"npu_mrope: mrope_section {mrope_section} asks multimodal mrope; "
                         "the plugin calls rope mode (None or [0, 0, 0])")
    if cache_mode != "default":
        raise ValueError(f"npu_mrope: cache_mode {cache_mode!r}; the plugin passes 'default'")
    rows = cos_sin_cache.float().index_select(0, positions.long())
    cos, sin = rows.chunk(2, dim=-1)
    return (rotate(query, cos, sin, rotary_mode, head_size).to(query.dtype),
            rotate(key, cos, sin, rotary_mode, head_size).to(key.dtype))


def mrope_emulated(positions, query, key, cos_sin_cache, head_size, *, mrope_section=None,
                   rotary_mode="half", cache_mode="default"):
    """The compiled kernel (``csrc/emu_layer_ops.cpp``: the rows of the positions gathered
    and every head rotated in one pass, fp32, one rounding) after the reference's checks,
    or the reference (the cases the kernel does not take, and every refused argument)."""
    _check(positions, query, key, cos_sin_cache, head_size, rotary_mode)
    kernel = emulation_kernel(KERNEL, query.device)
    if (kernel is None or (mrope_section is not None and any(mrope_section))
            or cache_mode != "default" or query.dtype not in ROPE_KERNEL_DTYPES
            or not query.dtype == key.dtype == cos_sin_cache.dtype
            or positions.dtype not in (torch.int32, torch.int64)
            or query.stride(1) != 1 or key.stride(1) != 1 or cos_sin_cache.stride(1) != 1):
        return mrope_reference(positions, query, key, cos_sin_cache, head_size,
                               mrope_section=mrope_section, rotary_mode=rotary_mode,
                               cache_mode=cache_mode)
    return kernel(positions.contiguous(), query, key, cos_sin_cache, head_size,
                  rotary_mode == "half")


def mrope_meta(positions, query, key, cos_sin_cache, head_size, *, mrope_section=None,
               rotary_mode="half", cache_mode="default"):
    _check(positions, query, key, cos_sin_cache, head_size, rotary_mode)
    return torch.empty_like(query), torch.empty_like(key)


def mrope_npu(positions, query, key, cos_sin_cache, head_size, *, mrope_section=None,
              rotary_mode="half", cache_mode="default"):
    return torch_npu_module().npu_mrope(positions, query, key, cos_sin_cache, head_size,
                                        mrope_section=mrope_section, rotary_mode=rotary_mode,
                                        cache_mode=cache_mode)


@npu_op(OP)
def npu_mrope(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
              cos_sin_cache: torch.Tensor, head_size: int, *,
              mrope_section: list[int] | None = None, rotary_mode: str = "half",
              cache_mode: str = "default"):
    impl = MROPE.pick(query.device)
    return impl(positions, query, key, cos_sin_cache, head_size, mrope_section=mrope_section,
                rotary_mode=rotary_mode, cache_mode=cache_mode)


MROPE = NpuOp(OP, npu=mrope_npu, reference=mrope_reference, meta=mrope_meta,
              emulation=mrope_emulated, kernel=KERNEL, rules="LAYER_OP_RULES")
