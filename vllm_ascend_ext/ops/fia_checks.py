"""Argument checks for ``npu_fused_infer_attention_score`` (FIA), shared by the
reference and the meta implementation, and the operator's keyword arguments (``FIAArgs``:
their one spelling, with torch_npu's defaults).

They read shapes, dtypes and host lists only (never tensor data), so they run on
``meta`` tensors too. Constraints follow ``docs/npu-ops.md`` section 1; each one
the NPU would reject is rejected here with a message naming the argument.

Relaxations of the emulation, on purpose and documented in docs/operators.md:
- fp32 query/key/value are accepted (exact tests); the NPU takes fp16/bf16 only.
Implemented subset: ``input_layout="TND"``; ``sparse_mode`` 0, 2, 3, 4; no
quantization, pse, shared prefix, rope or padding-size inputs (a non-None value
for those raises ``NotImplementedError`` naming it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields

import torch

NPU_DTYPES = (torch.float16, torch.bfloat16)
EMULATION_DTYPES = NPU_DTYPES + (torch.float32,)
# Head sizes served through TND + block_table. The kernel picks one of two TND paths
# (ops-transformer fused_infer_attention_score tiling): the prompt-flash path takes
# D = Dk = Dv in {64, 128}, or D = Dk = 192 with Dv 192 or 128; the split-fuse path takes
# D = Dk = Dv <= 256 but only for GQA (num_heads != num_key_value_heads, inner_precise 0),
# sparse_mode 0 or 3, and a 3-D (BnBsH) paged cache. So 256 (Qwen3-Next / Qwen3.5
# full attention) is served where each rank keeps fewer KV heads than query heads:
# ``tnd_head_dims_refusal``.
SUPPORTED_HEAD_SIZES = (64, 128, 192, 256)
SPLIT_FUSE_MAX_HEAD_SIZE = 256
SPLIT_FUSE_SPARSE_MODES = (0, 3)
MAX_GQA_RATIO = 64
MAX_BATCH = 4096
MASK_SIDE = 2048
SPARSE_MODES = (0, 2, 3, 4)  # 1 (allMask) and 9 (tree) are not implemented
# Paged TND: a multiple of 16 up to 512 (the tiling's MAX_BLOCK_SIZE; one doc section
# says 1024, the code and another section 512). Larger scheduler blocks (hybrid models
# align theirs to the mamba page) are split into kernel blocks: the backend declares
# every kernel block size it takes (KERNEL_BLOCK_SIZES), and vLLM picks the largest that
# divides its block.
# Defined here only: the FIA backend (KERNEL_BLOCK_SIZES) and contract mode's documented
# block_size rule (contract/op_rules.py) read these.
MAX_BLOCK_SIZE = 512
BLOCK_SIZE_ALIGN = 16
INT8_BLOCK_SIZE_ALIGN = 32  # int8 K/V (not emulated; contract mode checks it)
# Paged prefill (a request's query longer than one token: the documentation's "当Q_S大于1时"
# section) takes block_size in [128, 512], a multiple of 128. One cache serves prefill and
# decode, so the backend's kernel blocks are those (decode alone would take 16-multiples).
PAGED_PREFILL_BLOCK_ALIGN = 128
KERNEL_BLOCK_SIZES = tuple(range(PAGED_PREFILL_BLOCK_ALIGN, MAX_BLOCK_SIZE + 1,
                                 PAGED_PREFILL_BLOCK_ALIGN))
UNSUPPORTED_OPTIONALS = (
    "pse_shift", "dequant_scale1", "quant_scale1", "dequant_scale2", "quant_scale2",
    "quant_offset2", "antiquant_scale", "antiquant_offset", "key_antiquant_scale",
    "key_antiquant_offset", "value_antiquant_scale", "value_antiquant_offset",
    "query_padding_size", "kv_padding_size", "key_shared_prefix",
    "value_shared_prefix", "actual_shared_prefix_len", "query_rope", "key_rope",
    "key_rope_antiquant_scale",
)


INT_MAX = 2147483647


class FIAArgumentError(ValueError):
    """An FIA call the NPU operator would reject."""


@dataclass(frozen=True, slots=True)
class FIAArgs:
    """The keyword arguments of ``npu_fused_infer_attention_score`` with torch_npu's
    defaults: the one spelling of the operator's signature after its three positional
    tensors (query, key, value). ``optionals``: the named optionals the emulation does
    not implement (``UNSUPPORTED_OPTIONALS``; any value but None is refused)."""

    atten_mask: torch.Tensor | None = None
    actual_seq_lengths: Sequence[int] | None = None
    actual_seq_lengths_kv: Sequence[int] | None = None
    block_table: torch.Tensor | None = None
    num_heads: int = 1
    scale: float = 1.0
    pre_tokens: int = INT_MAX
    next_tokens: int = INT_MAX
    input_layout: str = "BSH"
    num_key_value_heads: int = 0
    sparse_mode: int = 0
    inner_precise: int = 0
    block_size: int = 0
    softmax_lse_flag: bool = False
    optionals: Mapping[str, object] = field(default_factory=dict)

    @classmethod
    def of(cls, kwargs: Mapping[str, object]) -> FIAArgs:
        """A call's keyword arguments; an unknown keyword raises TypeError, as a Python
        function of this signature would."""
        rest = {k: v for k, v in kwargs.items() if k not in FIA_KEYWORDS}
        unknown = set(rest) - set(UNSUPPORTED_OPTIONALS)
        if unknown:
            raise TypeError(f"npu_fused_infer_attention_score: unexpected arguments "
                            f"{sorted(unknown)}")
        if not rest:
            return cls(**kwargs)
        return cls(**{k: v for k, v in kwargs.items() if k in FIA_KEYWORDS}, optionals=rest)


# Every keyword argument but the optionals, with its default (what the NPU call passes).
FIA_KEYWORDS = {f.name: f.default for f in fields(FIAArgs) if f.name != "optionals"}


def tnd_head_dims_refusal(d: int, dv: int, num_heads: int, num_kv_heads: int,
                          sparse_mode: int = 3, cache_dims: int | None = 3) -> str | None:
    """Why FIA in TND layout refuses these head dims (None: one of its paths takes them).
    ``cache_dims``: the paged cache's dims (3 BnBsH, 4 BnNBsD), None without paging."""
    if (d == dv and d in (64, 128)) or (d == 192 and dv in (192, 128)):
        return None                                            # the prompt-flash path
    if d != dv or d > SPLIT_FUSE_MAX_HEAD_SIZE:
        return (f"head size {d} (value {dv}) is not taken in TND layout (D = Dk = Dv in "
                f"64/128, 192 with Dv 192 or 128, or up to {SPLIT_FUSE_MAX_HEAD_SIZE})")
    if num_heads == num_kv_heads:
        return (f"head size {d} with as many KV heads as query heads ({num_heads}) per rank: "
                f"FIA takes head sizes above 192 in TND only on its split-fuse path, which "
                f"needs GQA (fewer KV heads than query heads on each rank)")
    if sparse_mode not in SPLIT_FUSE_SPARSE_MODES:
        return (f"head size {d} needs the split-fuse path, which takes sparse_mode "
                f"{SPLIT_FUSE_SPARSE_MODES}, not {sparse_mode}")
    if cache_dims not in (None, 3):
        return (f"head size {d} needs the split-fuse path, which takes a 3-D (BnBsH) paged "
                f"cache, not {cache_dims}-D")
    return None


@dataclass(frozen=True)
class FIAPlan:
    """What the checks established, in plain values."""

    num_tokens: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    value_head_size: int
    q_lens: tuple[int, ...]  # per request
    kv_lens: tuple[int, ...]  # per request
    cu_q: tuple[int, ...]  # len B + 1, starts at 0
    cu_kv: tuple[int, ...] | None  # packed K/V only
    paged: bool
    block_size: int


def _fail(msg: str) -> None:
    raise FIAArgumentError(f"npu_fused_infer_attention_score: {msg}")


def _value_cache_mismatch(key: torch.Tensor, value: torch.Tensor, kvh: int,
                          block_size: int) -> None:
    want = (f"(num_blocks, {kvh}, {block_size}, Dv)" if key.dim() == 4 else
            f"(num_blocks, {block_size}, {kvh}*Dv)")
    _fail(f"value cache {tuple(value.shape)} does not match key cache {tuple(key.shape)}: "
          f"it must be {want}, the key cache's blocks in its layout with the value head size")


def _as_ints(name: str, values: Sequence[int] | None) -> tuple[int, ...]:
    if values is None:
        _fail(f"{name} is required with input_layout='TND'")
    if isinstance(values, torch.Tensor):
        _fail(f"{name} must be a host list of ints (SymInt[]), got a tensor")
    return tuple(int(v) for v in values)


def _check_cumulative(name: str, cum: tuple[int, ...], total: int) -> tuple[int, ...]:
    prev = 0
    for i, v in enumerate(cum):
        if v < prev:
            _fail(f"{name} must be non-decreasing (cumulative); element {i} is {v} < {prev}")
        prev = v
    if cum and cum[-1] != total:
        _fail(f"{name}[-1] = {cum[-1]} must equal the packed token count {total}")
    return (0,) + cum


def check_fia(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    atten_mask: torch.Tensor | None,
    actual_seq_lengths: Sequence[int] | None,
    actual_seq_lengths_kv: Sequence[int] | None,
    block_table: torch.Tensor | None,
    num_heads: int,
    input_layout: str,
    num_key_value_heads: int,
    sparse_mode: int,
    block_size: int,
    unsupported: dict[str, object],
) -> FIAPlan:
    for name, val in unsupported.items():
        if val is not None:
            raise NotImplementedError(
                f"npu_fused_infer_attention_score reference: {name} is not implemented"
            )
    if input_layout != "TND":
        raise NotImplementedError(
            f"npu_fused_infer_attention_score reference: input_layout={input_layout!r} "
            "is not implemented (TND only)"
        )
    if query.dtype not in EMULATION_DTYPES:
        _fail(f"query dtype {query.dtype} not supported (fp16/bf16; fp32 in emulation)")
    if key.dtype != query.dtype or value.dtype != query.dtype:
        _fail(f"key/value dtype ({key.dtype}/{value.dtype}) must match query ({query.dtype})")
    if query.dim() != 3:
        _fail(f"TND query must be [T, N, D], got shape {tuple(query.shape)}")
    T, n, d = query.shape
    if n != num_heads:
        _fail(f"query has {n} heads but num_heads={num_heads}")
    kvh = num_key_value_heads or num_heads
    if num_heads % kvh:
        _fail(f"num_heads={num_heads} is not divisible by num_key_value_heads={kvh}")
    if num_heads // kvh > MAX_GQA_RATIO:
        _fail(f"GQA ratio {num_heads // kvh} exceeds {MAX_GQA_RATIO}")
    if d not in SUPPORTED_HEAD_SIZES:
        _fail(f"head size {d} not supported (allowed: {SUPPORTED_HEAD_SIZES})")
    if block_table is None or value.dim() == 4:
        dv = value.shape[-1]
    else:                                      # BnBsH: (blocks, block size, KV_N * Dv)
        if value.dim() != 3 or value.shape[-1] % kvh:
            _value_cache_mismatch(key, value, kvh, block_size)
        dv = value.shape[-1] // kvh
    why = tnd_head_dims_refusal(d, dv, num_heads, kvh, sparse_mode,
                                key.dim() if block_table is not None else None)
    if why:
        _fail(why)
    if sparse_mode not in SPARSE_MODES:
        _fail(f"sparse_mode={sparse_mode} not supported (allowed: {SPARSE_MODES})")
    if sparse_mode in (2, 3, 4):
        if atten_mask is None:
            _fail(f"sparse_mode={sparse_mode} needs the {MASK_SIDE}x{MASK_SIDE} compressed mask")
        if tuple(atten_mask.shape[-2:]) != (MASK_SIDE, MASK_SIDE) or atten_mask.numel() != MASK_SIDE**2:
            _fail(
                f"sparse_mode={sparse_mode} needs atten_mask of shape ({MASK_SIDE}, {MASK_SIDE}), "
                f"got {tuple(atten_mask.shape)}"
            )
    if atten_mask is not None and atten_mask.dtype not in (torch.bool, torch.int8, torch.uint8):
        _fail(f"atten_mask dtype {atten_mask.dtype} not supported (bool/int8/uint8)")

    cu_q_end = _as_ints("actual_seq_lengths", actual_seq_lengths)
    B = len(cu_q_end)
    if B == 0 or B > MAX_BATCH:
        _fail(f"batch of {B} requests not supported (1..{MAX_BATCH})")
    cu_q = _check_cumulative("actual_seq_lengths", cu_q_end, T)
    q_lens = tuple(cu_q[i + 1] - cu_q[i] for i in range(B))
    kv_raw = _as_ints("actual_seq_lengths_kv", actual_seq_lengths_kv)
    if len(kv_raw) != B:
        _fail(
            f"actual_seq_lengths_kv has {len(kv_raw)} entries, actual_seq_lengths has {B}; "
            "the lists must be as long as the batch"
        )

    paged = block_table is not None
    cu_kv = None
    if paged:
        if block_table.dtype != torch.int32 or block_table.dim() != 2:
            _fail(f"block_table must be int32 [B, max_blocks], got {block_table.dtype} "
                  f"{tuple(block_table.shape)}")
        if block_table.shape[0] < B:
            _fail(f"block_table has {block_table.shape[0]} rows for a batch of {B}")
        if block_size <= 0 or block_size % BLOCK_SIZE_ALIGN or block_size > MAX_BLOCK_SIZE:
            _fail(f"block_size={block_size} must be a positive multiple of "
                  f"{BLOCK_SIZE_ALIGN} up to {MAX_BLOCK_SIZE}")
        if key.dim() == 3:  # BnBsH (nb, bs, KV_N*D)
            if key.shape[1] != block_size or key.shape[2] != kvh * d:
                _fail(f"paged key cache {tuple(key.shape)} does not match "
                      f"(num_blocks, {block_size}, {kvh}*{d})")
        elif key.dim() == 4:  # BnNBsD (nb, KV_N, bs, D)
            if tuple(key.shape[1:]) != (kvh, block_size, d):
                _fail(f"paged key cache {tuple(key.shape)} does not match "
                      f"(num_blocks, {kvh}, {block_size}, {d})")
        else:
            _fail(f"paged key cache must be 3-D or 4-D, got {tuple(key.shape)}")
        # The value cache: the key cache's blocks and heads, its own head size Dv (FIA
        # takes Dv != Dk: 192 with 128, tnd_head_dims_refusal), the same layout.
        if value.dim() != key.dim() or value.shape[:-1] != key.shape[:-1] \
                or value.shape[-1] != (kvh * dv if value.dim() == 3 else dv):
            _value_cache_mismatch(key, value, kvh, block_size)
        capacity = block_table.shape[1] * block_size
        for b, L in enumerate(kv_raw):
            if L < 0 or L > capacity:
                _fail(f"actual_seq_lengths_kv[{b}] = {L} outside 0..{capacity} "
                      "(block_table width x block_size)")
        kv_lens = kv_raw
    else:
        if key.dim() != 3 or key.shape[1] != kvh or key.shape[2] != d:
            _fail(f"TND key {tuple(key.shape)} does not match (T_kv, {kvh}, {d})")
        if value.dim() != 3 or value.shape[:2] != key.shape[:2]:
            _fail(f"TND value {tuple(value.shape)} does not match key {tuple(key.shape)}")
        cu_kv = _check_cumulative("actual_seq_lengths_kv", kv_raw, key.shape[0])
        kv_lens = tuple(cu_kv[i + 1] - cu_kv[i] for i in range(B))
        dv = value.shape[2]
    return FIAPlan(
        num_tokens=T, num_heads=num_heads, num_kv_heads=kvh, head_size=d,
        value_head_size=dv, q_lens=q_lens, kv_lens=kv_lens, cu_q=cu_q, cu_kv=cu_kv,
        paged=paged, block_size=block_size,
    )


class PlanMemo:
    """:func:`check_fia`'s last plan, reused while the same host tuples and the same
    tensor shapes come back.

    Every layer of a step passes the step's own tuples (the builder makes them once),
    so the per-request checks run once per step instead of once per layer. The checks
    read only shapes, dtypes, the scalar arguments and the host lists, and a tuple of
    ints cannot change: a hit (same tuple objects, equal signature) is the same check.
    Lists, tensors in the lists and the unsupported optionals are never memoized. Two
    plans are kept: a split step alternates its decode and prefill spans in every layer.
    """

    SIZE = 2

    def __init__(self) -> None:
        self._plans: tuple[tuple, ...] = ()  # (cu_q tuple, kv tuple, signature, plan), newest first

    def check(self, query, key, value, *, atten_mask, actual_seq_lengths,
              actual_seq_lengths_kv, block_table, num_heads, input_layout,
              num_key_value_heads, sparse_mode, block_size, unsupported) -> FIAPlan:
        sig = (query.dtype, query.shape, key.dtype, key.shape, value.dtype, value.shape,
               None if atten_mask is None else (atten_mask.dtype, atten_mask.shape),
               None if block_table is None else (block_table.dtype, block_table.shape),
               num_heads, input_layout, num_key_value_heads, sparse_mode, block_size)
        if not unsupported:
            for cu, kv, known, plan in self._plans:
                if cu is actual_seq_lengths and kv is actual_seq_lengths_kv and known == sig:
                    return plan
        plan = check_fia(
            query, key, value, atten_mask=atten_mask, actual_seq_lengths=actual_seq_lengths,
            actual_seq_lengths_kv=actual_seq_lengths_kv, block_table=block_table,
            num_heads=num_heads, input_layout=input_layout,
            num_key_value_heads=num_key_value_heads, sparse_mode=sparse_mode,
            block_size=block_size, unsupported=unsupported)
        if not unsupported and _int_tuple(actual_seq_lengths) and _int_tuple(actual_seq_lengths_kv):
            entry = (actual_seq_lengths, actual_seq_lengths_kv, sig, plan)
            self._plans = (entry, *self._plans[: self.SIZE - 1])
        return plan


def _int_tuple(values) -> bool:
    return type(values) is tuple and all(type(v) is int for v in values)
