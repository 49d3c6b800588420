"""The documented rules of each operator the plugin calls (see rules.py for the form).

Grouped by operator family (``FIA_RULES``, ``SFA_RULES`` ...; the MoE operators' in
``moe_rules.py``, the layer ops' in ``layer_op_rules.py``); each operator's record
(``ops/registry.py``) names the group that holds its rules, and the harness finds them
through it (``rules_for``).

Quotes are substrings of torch-npu 2.13.0's ``_op_plugin_docs.py``; ``tests/ut`` checks
that each one is found there. Operators without a documentation entry in the wheel
(``npu_kv_rmsnorm_rope_cache``, ``npu_interleave_rope``) carry hand-written rules,
marked as such.
"""

from __future__ import annotations

import torch

# the documented GDN bounds, as the GDN layers' op choice holds them
from vllm_ascend_ext.contract.layer_op_rules import LAYER_OP_RULES
from vllm_ascend_ext.contract.mc2_rules import MC2_RULES
from vllm_ascend_ext.contract.moe_rules import MOE_RULES
from vllm_ascend_ext.contract.rules import (
    HAND_WRITTEN,
    Call,
    Rule,
    all_of,
    contiguous,
    dims_in,
    dtype_in,
    indices_in_range,
    npu_format_is,
    same_dtype,
    tensor,
    when,
)
from vllm_ascend_ext.ops.fia_checks import (
    BLOCK_SIZE_ALIGN,
    INT8_BLOCK_SIZE_ALIGN,
    MAX_BLOCK_SIZE,
    PAGED_PREFILL_BLOCK_ALIGN,
)
from vllm_ascend_ext.ops.format import (
    ACL_FORMAT_FRACTAL_NZ,
    ACL_FORMAT_ND,
    format_name,
    npu_format,
)
from vllm_ascend_ext.ops.gdn_bounds import CHUNK_HEAD_DIM, CHUNK_MAX_HEADS, RECURRENT_MAX
from vllm_ascend_ext.ops.op_record import NpuOp
from vllm_ascend_ext.quantization.weight_format import NZ_FAMILIES

F16, BF16, F32, I8, I32, I64 = (torch.float16, torch.bfloat16, torch.float32, torch.int8,
                                torch.int32, torch.int64)


def _paged(call: Call) -> bool:
    return call.values.get("block_table") is not None


def _rows(*names: str):
    """Cache rows (blocks x block size) of the first of ``names`` that is given."""
    def upper(call: Call) -> int:
        for name in names:
            t = tensor(call, name)
            if t is not None:
                return t.shape[0] * t.shape[1]
        return 0
    return upper


# --- npu_fused_infer_attention_score ----------------------------------------------------

FIA = "npu_fused_infer_attention_score"
FIA_BLOCK_SIZE_READINGS = (
    "two readings: 'block_size最小为128, 最大为512, 且要求是128的倍数' (the section for Q_S > 1) "
    "and 'block_size需要传入非0值，且最大不超过512, key、value输入类型为float16、bfloat16时需要16对齐' "
    "(the TND/page-attention constraints); both checked: this one for every paged call, the "
    "first for paged calls with a query longer than one token (block size 128 passes both)")


def _fia_batch(call: Call) -> int | None:
    lens = call.values.get("actual_seq_lengths")
    return len(lens) if isinstance(lens, (list, tuple)) else None


def _fia_block_table_shape(call: Call) -> str | None:
    table, batch = tensor(call, "block_table"), _fia_batch(call)
    if table is None:
        return None
    if table.dim() != 2:
        return f"{table.dim()}-D block table; it must be 2-D"
    if batch is not None and table.shape[0] != batch:
        return f"first dimension {table.shape[0]} != batch {batch}"
    return None


def _fia_block_ids(call: Call) -> str | None:
    table, key = tensor(call, "block_table"), tensor(call, "key")
    kv_lens, block_size = call.values.get("actual_seq_lengths_kv"), call.values.get("block_size")
    if table is None or key is None or table.device.type == "meta" or not kv_lens or not block_size:
        return None
    for b, kv_len in enumerate(kv_lens[: table.shape[0]]):
        used = table[b, : -(-int(kv_len) // int(block_size))]
        if used.numel() and (int(used.min()) < 0 or int(used.max()) >= key.shape[0]):
            return (f"request {b} uses block ids {used.tolist()} outside [0, {key.shape[0]}) "
                    "(the key/value cache's blocks)")
    return None


def _fia_block_size(call: Call) -> str | None:
    size, key = call.values.get("block_size"), tensor(call, "key")
    align = INT8_BLOCK_SIZE_ALIGN if key is not None and key.dtype == I8 else BLOCK_SIZE_ALIGN
    if not size or size > MAX_BLOCK_SIZE or size % align:
        return (f"block_size {size}: must be non-zero, at most {MAX_BLOCK_SIZE} and a multiple "
                f"of {align}")
    return None


def _fia_longest_query(call: Call) -> int:
    """The longest request query of the call (TND: from the cumulative query ends)."""
    query, lens = tensor(call, "query"), call.values.get("actual_seq_lengths")
    if call.values.get("input_layout") == "TND":
        ends = [0, *(int(n) for n in (lens or ()))]
        return max((b - a for a, b in zip(ends, ends[1:])), default=0)
    if query is None or query.dim() < 3:
        return 0
    return int(query.shape[2 if call.values.get("input_layout") == "BNSD" else 1])


def _fia_paged_prefill_block_size(call: Call) -> str | None:
    size, longest = call.values.get("block_size"), _fia_longest_query(call)
    if longest <= 1 or (size and PAGED_PREFILL_BLOCK_ALIGN <= size <= MAX_BLOCK_SIZE
                        and size % PAGED_PREFILL_BLOCK_ALIGN == 0):
        return None
    return (f"block_size {size} with a query of {longest} tokens: paged "
            f"prefill takes multiples of {PAGED_PREFILL_BLOCK_ALIGN} in "
            f"[{PAGED_PREFILL_BLOCK_ALIGN}, {MAX_BLOCK_SIZE}]")


def _fia_kv_lengths(call: Call) -> str | None:
    if not call.values.get("actual_seq_lengths_kv"):
        return "missing: page attention needs per-request KV lengths"
    return None


FIA_RULES = (
    Rule(FIA, "query", "query: Tensor类型, attention结构的Query输入, 数据类型支持float16、bfloat16、int8, 不支持非连续的Tensor",
         all_of(dtype_in("query", F16, BF16, I8), contiguous("query"))),
    Rule(FIA, "key", "key: Tensor类型, attention结构的Key输入, 不支持非连续的Tensor", contiguous("key")),
    Rule(FIA, "value", "value: Tensor类型, attention结构的Value输入, 不支持非连续的Tensor",
         contiguous("value")),
    Rule(FIA, "key", "同时key、value是按照block_table中的索引在一片连续内存中排布, 支持key、value数据类型为float16、bfloat16、int8",
         when(_paged, all_of(dtype_in("key", F16, BF16, I8), contiguous("key")))),
    Rule(FIA, "value", "同时key、value是按照block_table中的索引在一片连续内存中排布, 支持key、value数据类型为float16、bfloat16、int8",
         when(_paged, all_of(dtype_in("value", F16, BF16, I8), contiguous("value")))),
    Rule(FIA, "key", "kv cache排布支持(blocknum, blocksize, H)和(blocknum, KV_N, blocksize, D)两种格式",
         when(_paged, dims_in("key", 3, 4))),
    Rule(FIA, "block_table", "block_table: Tensor类型, 数据类型支持int32", dtype_in("block_table", I32)),
    Rule(FIA, "block_table", "page attention场景下, block_table必须为二维, 第一维长度需等于B",
         _fia_block_table_shape),
    Rule(FIA, "block_table", "block_table中填充的是blockid, 当前不会对blockid的合法性进行校验, 需用户自行保证",
         _fia_block_ids),
    Rule(FIA, "block_size", "block_size需要传入非0值，且最大不超过512, key、value输入类型为float16、bfloat16时需要16对齐",
         when(_paged, _fia_block_size), note=FIA_BLOCK_SIZE_READINGS),
    Rule(FIA, "block_size", "在使能page attention场景下, block_size最小为128, 最大为512, 且要求是128的倍数",
         when(_paged, _fia_paged_prefill_block_size), note=FIA_BLOCK_SIZE_READINGS),
    Rule(FIA, "actual_seq_lengths_kv", "page attention场景下, 必须传入actual_seq_lengths_kv.",
         when(_paged, _fia_kv_lengths)),
)

# --- npu_scatter_pa_kv_cache (the FIA caches' writer, ND mode) ----------------------

SCATTER = "npu_scatter_pa_kv_cache"


def _same_dtypes(call: Call) -> str | None:
    names = ("key", "value", "key_cache", "value_cache")
    dtypes = {n: tensor(call, n).dtype for n in names if tensor(call, n) is not None}
    if len(set(dtypes.values())) > 1:
        return "dtypes differ: " + ", ".join(f"{n} {d}" for n, d in dtypes.items())
    return None


def _cache_format(call: Call) -> str | None:
    mode = call.values.get("cache_mode")
    want = ACL_FORMAT_FRACTAL_NZ if mode == "PA_NZ" else ACL_FORMAT_ND
    for name in ("key_cache", "value_cache"):
        t = tensor(call, name)
        if t is not None and npu_format(t) != want:
            return (f"cache_mode {mode!r} takes {format_name(want)} caches; {name} is "
                    f"{format_name(npu_format(t))}")
    return None


SCATTER_RULES = (
    Rule(SCATTER, "key", "输入参数不支持非连续",
         all_of(*(contiguous(n) for n in ("key", "value", "key_cache", "value_cache",
                                          "slot_mapping")))),
    Rule(SCATTER, "key_cache", "key、value、key_cache、value_cache的数据类型必须一致", _same_dtypes),
    Rule(SCATTER, "key_cache", "当传None或'Norm'时，仅支持ND内存排布格式。当传入'PA_NZ'时，仅支持NZ内存排布格式",
         _cache_format),
    Rule(SCATTER, "key_cache", "key_cache（Tensor）：必选参数，表示需要更新的key cache，当前layer的key cache，只支持4维",
         all_of(dims_in("key_cache", 4), dims_in("value_cache", 4))),
    Rule(SCATTER, "slot_mapping", "slot_mapping（Tensor）：必选参数，表示每个token key或value在cache中的存储偏移，数据类型支持int32和int64",
         dtype_in("slot_mapping", I32, I64)),
    Rule(SCATTER, "slot_mapping", "slot_mapping的值范围[0,num_blocks*block_size-1]",
         indices_in_range("slot_mapping", _rows("key_cache"), negative_ok=False)),
)

# --- SFA side ---------------------------------------------------------------------------

LI = "npu_lightning_indexer"
SFA = "npu_sparse_flash_attention"
MLA = "npu_mla_prolog_v3"
KVRC = "npu_kv_rmsnorm_rope_cache"
KVRC_SOURCE = (f"{HAND_WRITTEN}: the wheel documents no npu_kv_rmsnorm_rope_cache; "
               "index semantics as vllm-ascend's DeepSeek-V3.2 path uses them (int64 slots)")



SFA_RULES = (
    Rule(LI, "query", "query（Tensor）：必选参数，不支持非连续，数据格式支持ND，数据类型支持bfloat16和float16",
         all_of(dtype_in("query", BF16, F16), contiguous("query"))),
    Rule(LI, "key", "key（Tensor）：必选参数，不支持非连续，数据格式支持ND，数据类型支持bfloat16和float16",
         all_of(dtype_in("key", BF16, F16), contiguous("key"))),
    Rule(LI, "weights", "weights（Tensor）：必选参数，不支持非连续，数据格式支持ND，数据类型支持bfloat16和float16",
         all_of(dtype_in("weights", BF16, F16), contiguous("weights"))),
    Rule(LI, "block_table", "block_table（Tensor）：可选参数，表示PageAttention中KV存储使用的block映射表，数据格式支持ND，数据类型支持int32",
         dtype_in("block_table", I32)),
    Rule(LI, "actual_seq_lengths_query", "actual_seq_lengths_query（Tensor）：可选参数，表示不同Batch中query的有效token数，数据类型支持int32",
         dtype_in("actual_seq_lengths_query", I32)),
    Rule(LI, "actual_seq_lengths_key", "actual_seq_lengths_key（Tensor）：可选参数，表示不同Batch中key的有效token数，数据类型支持int32",
         dtype_in("actual_seq_lengths_key", I32)),
    Rule(SFA, "query", "query（Tensor）：必选参数，不支持非连续，数据格式支持ND，数据类型支持bfloat16和float16",
         all_of(dtype_in("query", BF16, F16), contiguous("query"))),
    Rule(SFA, "key", "key（Tensor）：必选参数，不支持非连续，数据格式支持ND，数据类型支持bfloat16和float16",
         all_of(dtype_in("key", BF16, F16), contiguous("key"))),
    Rule(SFA, "value", "value（Tensor）：必选参数，不支持非连续，数据格式支持ND，数据类型支持bfloat16和float16",
         all_of(dtype_in("value", BF16, F16), contiguous("value"))),
    Rule(SFA, "sparse_indices", "sparse_indices（Tensor）：必选参数，代表离散取kvCache的索引，不支持非连续，数据格式支持ND,数据类型支持int32",
         all_of(dtype_in("sparse_indices", I32), contiguous("sparse_indices"))),
    Rule(SFA, "block_table", "block_table（Tensor）：可选参数，表示PageAttention中kvCache存储使用的block映射表。数据格式支持ND，数据类型支持int32",
         dtype_in("block_table", I32)),
    Rule(SFA, "query_rope", "query_rope（Tensor）：可选参数，表示MLA结构中的query的rope信息，不支持非连续",
         contiguous("query_rope")),
    Rule(SFA, "key_rope", "key_rope（Tensor）：可选参数，表示MLA结构中的key的rope信息，不支持非连续",
         contiguous("key_rope")),
    Rule(MLA, "token_x", "token_x（Tensor）：必选参数，对应公式中x。shape支持2维和3维，格式为(T, He)和(B, S, He)，dtype支持bfloat16和int8",
         dtype_in("token_x", BF16, I8)),
    Rule(MLA, "weight_dq", "dtype支持bfloat16和int8，数据格式支持FRACTAL_NZ（可通过torch_npu.npu_format_cast将ND格式转为FRACTAL_NZ格式）",
         all_of(dtype_in("weight_dq", BF16, I8), npu_format_is("weight_dq", ACL_FORMAT_FRACTAL_NZ))),
    Rule(MLA, "weight_uq_qr", "格式为(Hcq, N*(D+Dr))，dtype支持bfloat16和int8，数据格式支持FRACTAL_NZ",
         all_of(dtype_in("weight_uq_qr", BF16, I8),
                npu_format_is("weight_uq_qr", ACL_FORMAT_FRACTAL_NZ))),
    Rule(MLA, "weight_dkv_kr", "格式为(He, Hckv+Dr)，dtype支持bfloat16和int8，数据格式支持FRACTAL_NZ",
         all_of(dtype_in("weight_dkv_kr", BF16, I8),
                npu_format_is("weight_dkv_kr", ACL_FORMAT_FRACTAL_NZ))),
    Rule(MLA, "weight_uk", "weight_uk（Tensor）：必选参数，表示计算Key的上采样权重，即公式中W<sup>UK</sup>。shape支持3维，格式为(N, D, Hckv)，dtype支持bfloat16",
         dtype_in("weight_uk", BF16)),
    Rule(MLA, "rope_sin", "rope_sin（Tensor）：必选参数，表示用于计算旋转位置编码的正弦参数矩阵。shape支持2维和3维，格式为(T, Dr)和(B, S, Dr)，dtype支持bfloat16",
         dtype_in("rope_sin", BF16)),
    Rule(MLA, "rope_cos", "rope_cos（Tensor）：必选参数，表示用于计算旋转位置编码的余弦参数矩阵。shape支持2维和3维，格式为(T, Dr)和(B, S, Dr)，dtype支持bfloat16",
         dtype_in("rope_cos", BF16)),
    Rule(MLA, "kv_cache", "kv_cache（Tensor）：必选参数，表示用于cache索引的aclTensor。shape支持4维，格式为(BlockNum, BlockSize, Nkv, Hckv)",
         dims_in("kv_cache", 4)),
    Rule(MLA, "kr_cache", "kr_cache（Tensor）：必选参数，表示用于key位置编码的cache。shape支持4维，格式为(BlockNum, BlockSize, Nkv, Dr)",
         dims_in("kr_cache", 4)),
    Rule(MLA, "cache_index", "cache_index（Tensor）：可选参数，表示用于存储kv_cache和kr_cache的索引。shape支持1维和2维，格式为(T)和(B, S)，dtype支持int64",
         all_of(dtype_in("cache_index", I64),
                indices_in_range("cache_index", _rows("kv_cache"), negative_ok=True))),
    Rule(KVRC, "index", "index: int64 cache slots, slot < num_blocks * block_size; negative slots are padding and skipped",
         all_of(dtype_in("index", I64),
                indices_in_range("index", _rows("ckv_cache", "k_cache"), negative_ok=True)),
         source=KVRC_SOURCE),
    Rule(KVRC, "k_cache", "k_cache, ckv_cache: written in place by the kernel (the schema returns them, without (a!)); in-place writes need contiguous memory",
         all_of(contiguous("k_cache"), contiguous("ckv_cache")), source=KVRC_SOURCE),
)

# --- Norm, quantization ------------------------------------------------------------------

RMS, DQ, QMM = "npu_rms_norm", "npu_dynamic_quant", "npu_quant_matmul"




def _output_dtype(call: Call) -> str | None:
    value = call.values.get("output_dtype")
    if value is not None and value not in (I8, F16, BF16, I32):
        return f"output_dtype {value} not in int8, float16, bfloat16, int32"
    return None


def _int32_output(call: Call) -> str | None:
    """The documented combination with ``output_dtype`` int32 (table 1's last column for
    A2/A3: x1/x2 int8, scale float32/bfloat16, offset None, pertoken_scale None, bias
    int32/None)."""
    x1, bias, scale = tensor(call, "x1"), tensor(call, "bias"), tensor(call, "scale")
    if call.values.get("output_dtype") != I32 or x1 is None or x1.dtype != I8:
        return None
    for name in ("pertoken_scale", "offset"):
        if tensor(call, name) is not None:
            return f"{name} given with output_dtype int32 (the combination has none)"
    if scale is not None and scale.dtype not in (F32, BF16):
        return f"scale {scale.dtype} with output_dtype int32 (float32 or bfloat16)"
    if bias is not None and bias.dtype != I32:
        return f"bias {bias.dtype} with output_dtype int32 (int32 or None)"
    return None


def _x2_nz_family(call: Call) -> str | None:
    t = tensor(call, "x2")
    if t is not None and npu_format(t) == ACL_FORMAT_FRACTAL_NZ and call.family not in NZ_FAMILIES:
        return (f"x2 is FRACTAL_NZ on {call.family}; the documentation gives the NZ weight "
                "(k, n, not transposed) for A2/A3 only: keep it ND there")
    return None


NORM_QUANT_RULES = (
    Rule(RMS, "self", "输入数据类型仅支持float16、bfloat16和float32", dtype_in("self", F16, BF16, F32)),
    Rule(RMS, "gamma", "gamma：Tensor类型，数据类型需要和self保持一致", same_dtype("gamma", "self")),
    Rule(DQ, "input", "x: Tensor类型, 需要进行量化的源数据张量, 必选输入, 数据类型支持torch.float16、torch.bfloat16",
         dtype_in("input", F16, BF16)),
    Rule(DQ, "smooth_scales", "smooth_scales: Tensor类型, 对x进行scales的张量, 可选输入, 数据类型支持torch.float16、torch.bfloat16",
         dtype_in("smooth_scales", F16, BF16)),
    Rule(QMM, "x1", "Atlas A2 训练系列产品/Atlas 800I A2 推理产品: 数据类型支持int8和int32", dtype_in("x1", I8, I32)),
    Rule(QMM, "x2", "Atlas A2 训练系列产品/Atlas 800I A2 推理产品: 数据类型与x1的数据类型保持一致", same_dtype("x2", "x1")),
    Rule(QMM, "scale", "Atlas A2 训练系列产品/Atlas 800I A2 推理产品: 数据类型支持float32、int64、bfloat16. shape需要是1维",
         all_of(dtype_in("scale", F32, I64, BF16), dims_in("scale", 1))),
    Rule(QMM, "pertoken_scale", "Atlas A2 训练系列产品/Atlas 800I A2 推理产品: 数据类型支持float32. shape需要是1维(m,)",
         all_of(dtype_in("pertoken_scale", F32), dims_in("pertoken_scale", 1))),
    Rule(QMM, "output_dtype", "Atlas A2 训练系列产品/Atlas 800I A2 推理产品: 支持输入torch.int8、torch.float16、torch.bfloat16、torch.int32",
         _output_dtype),
    Rule(QMM, "output_dtype", "output_dtype:float16, int8, bfloat16, float16, float16, int32",
         _int32_output, note="table 1 (A2/A3): int8 x1 with int32 output takes no pertoken_scale"),
    Rule(QMM, "x2", "将x2非转置(batch, k, n)后转format, 示例代码如下, 仅支持如下产品", _x2_nz_family,
         note="the products listed after it are A2 and A3; A2/A3 also read "
              "'推荐x2不转置直接转亲和format'"),
)

# --- Gated-DeltaNet ------------------------------------------------------------------------

RGDR, CGDR = "npu_recurrent_gated_delta_rule", "npu_chunk_gated_delta_rule"


def _gdn_bound(limit: int, *, exact: int | None = None, heads: bool = True, dims: bool = True):
    def check(call: Call) -> str | None:
        q, v = tensor(call, "query"), tensor(call, "value")
        if q is None or v is None or q.dim() != 3 or v.dim() != 3:
            return None
        sizes = {}
        if heads:
            sizes.update(Nk=q.shape[1], Nv=v.shape[1])
        if dims:
            sizes.update(Dk=q.shape[2], Dv=v.shape[2])
        bad = [f"{k}={n}" for k, n in sizes.items()
               if (n != exact if exact is not None else n > limit)]
        return (f"{', '.join(bad)}; documented {'= ' + str(exact) if exact else '<= ' + str(limit)}"
                if bad else None)
    return check


def _shape_t(name: str):
    def check(call: Call) -> str | None:
        t, q = tensor(call, name), tensor(call, "query")
        if t is None or q is None or tuple(t.shape) == (q.shape[0],):
            return None
        return f"shape {tuple(t.shape)}; documented (T,) = ({q.shape[0]},)"
    return check


def _nv_multiple_of_nk(call: Call) -> str | None:
    q, v = tensor(call, "query"), tensor(call, "value")
    if q is None or v is None or q.dim() != 3 or v.dim() != 3 or v.shape[1] % q.shape[1] == 0:
        return None
    return f"Nv={v.shape[1]} is not a multiple of Nk={q.shape[1]}"


GDN_RULES = (
    *(Rule(op, name, f"对应公式中的{sym}，数据类型支持bfloat16", dtype_in(name, BF16))
      for op in (RGDR, CGDR) for name, sym in (("query", "q"), ("key", "k"), ("value", "v"))),
    Rule(RGDR, "state", "对应公式中的状态矩阵S，数据类型支持bfloat16", dtype_in("state", BF16)),
    Rule(CGDR, "initial_state", "对应公式中的状态矩阵S，数据类型支持bfloat16",
         dtype_in("initial_state", BF16)),
    *(Rule(op, "beta", "对应公式中的β，数据类型支持bfloat16", dtype_in("beta", BF16))
      for op in (RGDR, CGDR)),
    *(Rule(op, "g", "数据类型支持float32，数据格式支持ND，shape为（T, Nv）", dtype_in("g", F32))
      for op in (RGDR, CGDR)),
    *(Rule(op, "actual_seq_lengths", "各batch的输入序列长度。数据类型支持int32",
           all_of(dtype_in("actual_seq_lengths", I32), dims_in("actual_seq_lengths", 1)))
      for op in (RGDR, CGDR)),
    Rule(RGDR, "ssm_state_indices", "数据类型支持int32，数据格式支持ND，shape为（T,）",
         all_of(dtype_in("ssm_state_indices", I32), _shape_t("ssm_state_indices"))),
    Rule(RGDR, "num_accepted_tokens", "投机推理每个batch接受的token数量",
         dtype_in("num_accepted_tokens", I32)),
    Rule(RGDR, "query", "$N_k \\le 256$，$N_v \\le 256$，$D_k \\le 256$，$D_v \\le 256$",
         _gdn_bound(RECURRENT_MAX)),
    Rule(CGDR, "query", "$N_k \\le 64$，$N_v \\le 64$", _gdn_bound(CHUNK_MAX_HEADS, dims=False)),
    Rule(CGDR, "query", "$D_k = 128$，$D_v = 128$", _gdn_bound(0, exact=CHUNK_HEAD_DIM, heads=False)),
    Rule(CGDR, "value", "$N_v$是$N_k$整数倍", _nv_multiple_of_nk),
)

# The groups an operator's record names (``NpuOp.rules``).
GROUPS: dict[str, tuple[Rule, ...]] = {
    "FIA_RULES": FIA_RULES, "SCATTER_RULES": SCATTER_RULES, "SFA_RULES": SFA_RULES,
    "NORM_QUANT_RULES": NORM_QUANT_RULES, "MOE_RULES": MOE_RULES, "GDN_RULES": GDN_RULES,
    "LAYER_OP_RULES": LAYER_OP_RULES, "MC2_RULES": MC2_RULES}
RULES: tuple[Rule, ...] = tuple(rule for group in GROUPS.values() for rule in group)
# Operators with a yaml schema but no Python Meta kernel in the wheel (their meta lives in
# torch_npu's C++ library): the harness binds the schema and checks the rules only.
WITHOUT_PYTHON_META = {"npu_format_cast": "torch_npu registers it in C++ (format casts are "
                                          "shape-preserving)"}
# Operators whose schema is not in the yaml: the hand-written one, and where it comes from.
# None today: every operator the plugin calls has one (ATB's _npu_reshape_and_cache, which
# has none, is no longer called).
HAND_WRITTEN_SCHEMAS: dict[str, tuple[str, str]] = {}


def rules_for(op: NpuOp) -> tuple[Rule, ...]:
    """The documented rules of ``op``: its rules in the group its record names."""
    if op.rules is None:
        return ()
    return tuple(r for r in GROUPS[op.rules] if r.op == op.name)
