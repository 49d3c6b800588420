"""Which route each of the plugin's layer ops takes: pure functions of shapes and dtypes.

The layer ops (``layers/``) call one fused torch_npu operator where its documentation
covers the case and fall back to vLLM's native PyTorch where it does not; the decision is
made here, from Python values only (no tensor is read), so it costs no host sync and is
tested without vLLM. Each function returns ``(route, why)``; they are called per forward
(a handful of comparisons; traced through, never cached, under torch.compile).
"""

from __future__ import annotations

import torch

FUSED, NATIVE = "fused", "native"
_HALF = (torch.float16, torch.bfloat16)
_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def _norm_dtypes(x_dtype, weight_dtype, residual_dtype, op: str) -> str | None:
    """Why a norm's dtypes keep it off the fused ops, or None."""
    if residual_dtype is not None and residual_dtype != x_dtype:
        return (f"residual dtype {residual_dtype} differs from the input's {x_dtype} "
                "(npu_add_rms_norm adds two tensors of one dtype)")
    if x_dtype not in _FLOATS:
        return f"input dtype {x_dtype} is not float16, bfloat16 or float32"
    if weight_dtype != x_dtype:
        return f"weight dtype {weight_dtype} differs from the input's {x_dtype} ({op} asks them equal)"
    return None


def rms_norm_route(x_dtype: torch.dtype, x_dims: int, weight_dtype: torch.dtype,
                   has_weight: bool, variance_size_override: int | None,
                   residual_dtype: torch.dtype | None = None) -> tuple[str, str]:
    """``npu_rms_norm`` / ``npu_add_rms_norm`` for vLLM's ``RMSNorm``."""
    if not 2 <= x_dims <= 8:
        return NATIVE, f"{x_dims}-D input: npu_rms_norm takes 2-8 dims"
    if variance_size_override is not None:
        return NATIVE, ("the variance is taken over a prefix of the hidden size "
                        f"({variance_size_override}); the fused ops normalise over all of it")
    if not has_weight:
        return NATIVE, "no weight: the fused ops multiply by gamma"
    why = _norm_dtypes(x_dtype, weight_dtype, residual_dtype, "npu_rms_norm")
    if why:
        return NATIVE, why
    return FUSED, "npu_rms_norm (npu_add_rms_norm with a residual)"


def gemma_norm_route(x_dtype: torch.dtype, weight_dtype: torch.dtype,
                     residual_dtype: torch.dtype | None = None) -> tuple[str, str]:
    """``npu_gemma_rms_norm`` / ``npu_add_rms_norm`` with ``1 + w`` for ``GemmaRMSNorm``."""
    why = _norm_dtypes(x_dtype, weight_dtype, residual_dtype, "npu_gemma_rms_norm")
    if why:
        return NATIVE, why
    return FUSED, "npu_gemma_rms_norm (npu_add_rms_norm with gamma 1 + w and a residual)"


def rope_route(head_size: int, rotary_dim: int, dtype: torch.dtype,
               has_key: bool) -> tuple[str, str]:
    """``npu_mrope`` (rope mode) for vLLM's ``RotaryEmbedding``."""
    if not has_key:
        return NATIVE, "no key: npu_mrope rotates query and key together"
    if dtype not in _FLOATS:
        return NATIVE, f"dtype {dtype} is not float16, bfloat16 or float32"
    multiple = 32 if dtype in _HALF else 16
    if rotary_dim % multiple:
        return NATIVE, (f"rotary_dim {rotary_dim} is not a multiple of {multiple} "
                        f"({str(dtype).removeprefix('torch.')}), as npu_mrope asks")
    if rotary_dim > head_size:
        return NATIVE, f"rotary_dim {rotary_dim} exceeds head_size {head_size}"
    return FUSED, "npu_mrope (rope mode: one launch for query and key)"


def swiglu_route(dtype: torch.dtype, width: int) -> tuple[str, str]:
    """``npu_swiglu`` for vLLM's ``SiluAndMul``."""
    if dtype not in _FLOATS:
        return NATIVE, f"dtype {dtype} is not float16, bfloat16 or float32"
    if width % 2:
        return NATIVE, f"last dim {width} is odd"
    return FUSED, "npu_swiglu"


def norm_quant_route(x_dtype: torch.dtype, weight_dtype: torch.dtype) -> tuple[str, str]:
    """``npu_add_rms_norm_dynamic_quant`` for a post-attention RMSNorm whose only consumer
    is a W8A8 dynamic linear (a dense W8A8 MLP's gate_up_proj)."""
    if x_dtype not in _HALF:
        return NATIVE, (f"input dtype {x_dtype}: npu_add_rms_norm_dynamic_quant takes "
                        "float16 or bfloat16")
    if weight_dtype != x_dtype:
        return NATIVE, (f"weight dtype {weight_dtype} differs from the input's {x_dtype} "
                        "(the op asks gamma in x1's dtype)")
    return FUSED, "npu_add_rms_norm_dynamic_quant feeding npu_quant_matmul"
