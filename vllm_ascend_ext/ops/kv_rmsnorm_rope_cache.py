"""``torch_npu.npu_kv_rmsnorm_rope_cache``: MLA key-side RmsNorm + RoPE + paged cache write.

Semantics (``docs/npu-ops.md`` §3, golden ``test_npu_kv_rms_norm_rope_cache.py``):

- ``kv`` [B,1,S,Dc+Dr] (Dc=512, Dr=64 on the NPU): ``kv[..., :Dc]`` -> RmsNorm with
  ``gamma`` [Dc]; ``kv[..., Dc:]`` -> interleaved-input RoPE written half-split
  (§0.7) with ``cos``/``sin`` [B,1,S,Dr].
- ``index`` **int64** [B*S], global slot ``block * block_size + offset`` (cache
  modes ``PA``/``PA_BNSD``); negative index -> not written.
- ``k_cache`` is the **rope** cache [nb,bs,1,Dr], ``ckv_cache`` the **latent** cache
  [nb,bs,1,Dc]; written in place and returned.
- Quantized caches (``k_rope_scale`` [Dr], ``c_kv_scale`` [Dc] fp32, int8 caches):
  ``round(value * scale)`` saturated to int8 (scales multiply).
- ``is_output_kv=True`` also returns ``k_embed_out`` [B,1,S,Dr] and ``y_out``
  [B,1,S,Dc] in ``kv``'s dtype (unquantized); otherwise those are None.

Emulated: cache modes PA / PA_BNSD; offsets, the ``v`` variant and the NZ / BLK
modes raise NotImplementedError.
"""

from __future__ import annotations

import torch

from vllm_ascend_ext.ops._dispatch import torch_npu_module
from vllm_ascend_ext.ops.counting import npu_op
from vllm_ascend_ext.ops.norm import rms_fp32
from vllm_ascend_ext.ops.op_record import NpuOp
from vllm_ascend_ext.ops.paged_write import check_paged_cache, check_slots, write_rows
from vllm_ascend_ext.ops.rope import rope_interleave_half

OP = "npu_kv_rmsnorm_rope_cache"


def _check(kv, gamma, cos, sin, index, k_cache, ckv_cache, k_rope_offset, c_kv_offset, v,
           cache_mode):
    if cache_mode not in ("PA", "PA_BNSD"):
        raise NotImplementedError(f"{OP}: cache_mode {cache_mode!r} is not emulated (PA, PA_BNSD)")
    if v is not None or k_rope_offset is not None or c_kv_offset is not None:
        raise NotImplementedError(f"{OP}: the v variant and quant offsets are not emulated")
    if kv.dim() != 4 or kv.shape[1] != 1:
        raise ValueError(f"{OP}: kv must be [B,1,S,Dc+Dr], got {tuple(kv.shape)}")
    dc = gamma.shape[-1]
    dr = kv.shape[-1] - dc
    if dr <= 0 or dr % 2:
        raise ValueError(f"{OP}: kv width {kv.shape[-1]} - gamma width {dc} must be an even rope dim")
    for name, t in (("cos", cos), ("sin", sin)):
        if tuple(t.shape) != (*kv.shape[:3], dr):
            raise ValueError(f"{OP}: {name} must be {(*kv.shape[:3], dr)}, got {tuple(t.shape)}")
    check_slots(OP, index, kv.shape[0] * kv.shape[2])
    check_paged_cache(OP, "k_cache (rope)", k_cache, dr)
    check_paged_cache(OP, "ckv_cache (latent)", ckv_cache, dc)
    return dc, dr


def kv_rmsnorm_rope_cache_reference(kv, gamma, cos, sin, index, k_cache, ckv_cache, *,
                                    k_rope_scale=None, c_kv_scale=None, k_rope_offset=None,
                                    c_kv_offset=None, v=None, epsilon=1e-5, cache_mode="Norm",
                                    is_output_kv=False):
    dc, _ = _check(kv, gamma, cos, sin, index, k_cache, ckv_cache, k_rope_offset, c_kv_offset,
                   v, cache_mode)
    y = rms_fp32(kv[..., :dc], gamma, epsilon)
    k = rope_interleave_half(kv[..., dc:], cos, sin)
    if k_rope_scale is not None:
        kq = torch.round(k * k_rope_scale.float()).clamp(-128, 127).to(torch.int8)
        yq = torch.round(y * c_kv_scale.float()).clamp(-128, 127).to(torch.int8)
    else:
        kq, yq = k, y
    write_rows(k_cache, index, kq)
    write_rows(ckv_cache, index, yq)
    # Four tensors whatever is_output_kv says, as the official meta returns them (the last
    # two are the intermediate results; callers that did not ask ignore them).
    return k_cache, ckv_cache, k.to(kv.dtype), y.to(kv.dtype)


def kv_rmsnorm_rope_cache_meta(kv, gamma, cos, sin, index, k_cache, ckv_cache, *,
                               k_rope_scale=None, c_kv_scale=None, k_rope_offset=None,
                               c_kv_offset=None, v=None, epsilon=1e-5, cache_mode="Norm",
                               is_output_kv=False):
    dc, dr = _check(kv, gamma, cos, sin, index, k_cache, ckv_cache, k_rope_offset, c_kv_offset,
                    v, cache_mode)
    return (k_cache, ckv_cache, kv.new_empty((*kv.shape[:3], dr)),
            kv.new_empty((*kv.shape[:3], dc)))


def kv_rmsnorm_rope_cache_npu(kv, gamma, cos, sin, index, k_cache, ckv_cache, **kw):
    return torch_npu_module().npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache,
                                                        ckv_cache, **kw)


@npu_op(OP)
def npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache, ckv_cache, *,
                              k_rope_scale=None, c_kv_scale=None, k_rope_offset=None,
                              c_kv_offset=None, v=None, epsilon: float = 1e-5,
                              cache_mode: str = "Norm", is_output_kv: bool = False):
    impl = KV_RMSNORM_ROPE_CACHE.pick(kv.device)
    return impl(kv, gamma, cos, sin, index, k_cache, ckv_cache, k_rope_scale=k_rope_scale,
                c_kv_scale=c_kv_scale, k_rope_offset=k_rope_offset, c_kv_offset=c_kv_offset,
                v=v, epsilon=epsilon, cache_mode=cache_mode, is_output_kv=is_output_kv)


KV_RMSNORM_ROPE_CACHE = NpuOp(OP, npu=kv_rmsnorm_rope_cache_npu,
                              reference=kv_rmsnorm_rope_cache_reference,
                              meta=kv_rmsnorm_rope_cache_meta, rules="SFA_RULES")
