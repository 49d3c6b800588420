"""The NPU contract harness: torch-npu 2.13's schemas, official metas and documented rules,
exercised through the plugin's real torch_npu call sites (contract mode)."""

from __future__ import annotations

import sys

import pytest
import torch

from vllm_ascend_ext.contract import docs, metas, mode, op_rules, schemas
from vllm_ascend_ext.contract.harness import ContractViolation
from vllm_ascend_ext.errors import AscendExtError
from vllm_ascend_ext.ops.fia import causal_mask_2048, npu_fused_infer_attention_score
from vllm_ascend_ext.ops.format import ACL_FORMAT_FRACTAL_NZ, npu_format, npu_format_cast
from vllm_ascend_ext.ops.kv_cache import npu_scatter_pa_kv_cache
from vllm_ascend_ext.ops.kv_rmsnorm_rope_cache import npu_kv_rmsnorm_rope_cache
from vllm_ascend_ext.ops.mla_prolog import npu_mla_prolog_v3
from vllm_ascend_ext.ops.norm import npu_rms_norm
from vllm_ascend_ext.ops.quant import npu_dynamic_quant, npu_quant_matmul
from vllm_ascend_ext.ops.registry import TORCH_NPU_OPS
from vllm_ascend_ext.platform.soc import from_name

NB, NKV, BS, D, NQ = 8, 2, 128, 64, 4


def _fia(query=None, key=None, value=None, **over):
    cache = torch.randn(NB, BS, NKV * D, dtype=torch.bfloat16)
    kw = dict(atten_mask=causal_mask_2048(), actual_seq_lengths=[1, 5],
              actual_seq_lengths_kv=[100, 140],
              block_table=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32), num_heads=NQ,
              num_key_value_heads=NKV, scale=D**-0.5, input_layout="TND", sparse_mode=3,
              block_size=BS)
    kw.update(over)
    query = torch.randn(5, NQ, D, dtype=torch.bfloat16) if query is None else query
    return npu_fused_infer_attention_score(query, cache if key is None else key,
                                           cache.clone() if value is None else value, **kw)


def test_oracle_defines_every_schema_privately_and_never_enters_torch_npu():
    assert len(schemas.all_schemas()) == 428  # the pinned yaml's torch_npu operators
    metas.load()
    for op in TORCH_NPU_OPS:
        if op not in op_rules.HAND_WRITTEN_SCHEMAS:
            assert metas.has_meta(op) != (op in op_rules.WITHOUT_PYTHON_META), op
    assert "torch_npu" not in sys.modules
    with pytest.raises(RuntimeError, match="does not exist"):  # nothing in torch.ops.npu
        torch._C._dispatch_has_kernel_for_dispatch_key("npu::npu_rms_norm", "Meta")
    assert not metas.has_meta("_npu_reshape_and_cache")  # ATB: no schema, no meta


def test_every_rule_quotes_a_line_the_pinned_documentation_has():
    for rule in op_rules.RULES:
        cited = rule.cites()  # docs.line raises DocLineMissing for a stale quote
        assert rule.quote in cited
    with pytest.raises(docs.DocLineMissing):
        docs.line("npu_rms_norm", "a sentence the documentation does not have")


@pytest.mark.parametrize("op,expected", [
    ("npu_dynamic_quant", ("A2", "A3")), ("npu_scatter_pa_kv_cache", ("A2", "A3")),
    ("npu_recurrent_gated_delta_rule", ("A2", "A3")), ("npu_fused_causal_conv1d", ("A5",)),
    ("npu_quant_matmul", ("310P", "A2", "A3")),
    # pages headed 支持的芯片型号 (some with <term> tags) instead of 支持的型号
    ("npu_fused_infer_attention_score", ("A2", "A3")), ("npu_mla_prolog_v3", ("A2", "A3")),
    ("npu_dequant_swiglu_quant", ("A2", "A3")), ("npu_mrope", None),
])
def test_supported_products_are_read_from_the_documentation(op, expected):
    assert docs.families(op) == expected


def test_official_meta_runs_on_strided_meta_copies_and_rejects_with_its_message():
    op = metas.op("npu_fused_infer_attention_score")
    strided = torch.empty_strided((8, 128, 128), (32768, 128, 1), device="meta",
                                  dtype=torch.bfloat16)
    out, lse = op(torch.empty(5, 4, 64, device="meta", dtype=torch.bfloat16), strided, strided,
                  num_heads=4, num_key_value_heads=2, input_layout="TND",
                  actual_seq_lengths=[5], actual_seq_lengths_kv=[100], block_size=128,
                  block_table=torch.empty(1, 1, dtype=torch.int32, device="meta"))
    assert tuple(out.shape) == (5, 4, 64) and tuple(lse.shape) == (0,)
    with pytest.raises(RuntimeError, match="numHeads should be greater than 0"):
        op(out, strided, strided, num_heads=0, input_layout="TND")


def test_valid_calls_pass_and_equal_contract_mode_off(contract, monkeypatch):
    h = contract()
    torch.manual_seed(0)
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    gamma = torch.randn(64, dtype=torch.bfloat16)
    on = npu_rms_norm(x, gamma, 1e-6)[0]
    xq, sx = npu_dynamic_quant(x)
    w = torch.randint(-8, 8, (64, 32), dtype=torch.int8)
    y = npu_quant_matmul(xq, w, torch.rand(32), pertoken_scale=sx.reshape(-1),
                         output_dtype=torch.bfloat16)
    monkeypatch.setenv(mode.ENV, "0")
    assert torch.equal(on, npu_rms_norm(x, gamma, 1e-6)[0])
    assert y.dtype == torch.bfloat16 and y.shape == (4, 32)
    assert h.calls == {"npu_rms_norm": 1, "npu_dynamic_quant": 1, "npu_quant_matmul": 1}
    assert h.summary().startswith(
        "ascend_ext npu-contract: validated 3 calls (npu_dynamic_quant=1, npu_quant_matmul=1, "
        "npu_rms_norm=1), violations 0")


# Negative controls: each through the plugin's real call site, each naming the operator,
# the argument and the documentation line (or the official message) it rests on.

def test_misspelt_keyword(contract):
    with pytest.raises(ContractViolation,
                       match=r"npu_fused_infer_attention_score: argument num_head: unknown keyword"):
        _fia(key=torch.randn(NB, BS, NKV * D, dtype=torch.bfloat16), num_head=4)


def test_non_contiguous_key_cache(contract):
    """K and V planes interleaved per block, viewed per block (the plugin's former
    views): strided across blocks."""
    planes = torch.randn(NB, 2, BS, NKV * D, dtype=torch.bfloat16)
    with pytest.raises(ContractViolation) as info:
        _fia(key=planes[:, 0], value=planes[:, 1])
    assert "argument key: non-contiguous tensor" in str(info.value)
    assert "不支持非连续的Tensor" in str(info.value)


def test_int64_block_table(contract):
    with pytest.raises(ContractViolation, match=r"argument block_table: dtype int64 not in "
                                                r"int32 \[rule: \"block_table: Tensor类型, 数据类型支持int32"):
        _fia(block_table=torch.tensor([[0, 1], [2, 3]]))


def test_fp32_query(contract):
    with pytest.raises(ContractViolation, match=r"argument query: dtype float32 not in float16, "
                                                r"bfloat16, int8 .*数据类型支持float16、bfloat16、int8"):
        _fia(query=torch.randn(5, NQ, D))


def test_block_ids_beyond_the_cache(contract):
    with pytest.raises(ContractViolation, match=r"argument block_table: request 1 uses block ids "
                                                r"\[2, 9\] outside \[0, 8\)"):
        _fia(block_table=torch.tensor([[0, 1], [2, 9]], dtype=torch.int32))


def test_out_of_range_slot(contract):
    key = torch.randn(3, NKV, D, dtype=torch.bfloat16)
    cache = torch.zeros(2, 16, NKV, D, dtype=torch.bfloat16)
    with pytest.raises(ContractViolation, match=r"npu_scatter_pa_kv_cache: argument slot_mapping: "
                                                r"index 32 out of range \(must be < 32\).*"
                                                r"slot_mapping的值范围\[0,num_blocks\*block_size-1\]"):
        npu_scatter_pa_kv_cache(key, key, cache, cache.clone(),
                                torch.tensor([0, 7, 32], dtype=torch.int32))
    with pytest.raises(ContractViolation, match=r"argument slot_mapping: index -1 < 0"):
        npu_scatter_pa_kv_cache(key, key, cache, cache.clone(),
                                torch.tensor([0, -1, 31], dtype=torch.int32))   # no padding
    npu_scatter_pa_kv_cache(key, key, cache, cache.clone(),
                            torch.tensor([0, 7, 31], dtype=torch.int32))        # fine


def test_nz_cache_mode_with_nd_caches(contract):
    """torch_npu's default cache_mode is PA_NZ: ND caches need "Norm"."""
    key = torch.randn(2, NKV, D, dtype=torch.bfloat16)
    cache = torch.zeros(2, 16, NKV, D, dtype=torch.bfloat16)
    with pytest.raises(ContractViolation, match=r"cache_mode 'PA_NZ' takes FRACTAL_NZ caches; "
                                                r"key_cache is ND"):
        npu_scatter_pa_kv_cache(key, key, cache, cache.clone(),
                                torch.tensor([0, 1], dtype=torch.int32), cache_mode="PA_NZ")


def _prolog(nz: bool, kv_cache=None, kr_cache=None):
    """npu_mla_prolog_v3 at its call-site form: bf16, [in, out] weights, PA_BSND caches."""
    g = torch.Generator().manual_seed(0)
    t, he, hcq, n, d, dr, hckv = 3, 64, 32, 2, 16, 64, 128
    r = lambda *s: (torch.randn(*s, generator=g) / s[0] ** 0.5).to(torch.bfloat16)  # noqa: E731
    w_dq, w_uq, w_kv = r(he, hcq), r(hcq, n * (d + dr)), r(he, hckv + dr)
    if nz:
        w_dq, w_uq, w_kv = (npu_format_cast(w, ACL_FORMAT_FRACTAL_NZ) for w in (w_dq, w_uq, w_kv))
    cos = torch.ones(t, dr, dtype=torch.bfloat16)
    kv_cache = torch.zeros(2, 16, 1, hckv, dtype=torch.bfloat16) if kv_cache is None else kv_cache
    kr_cache = torch.zeros(2, 16, 1, dr, dtype=torch.bfloat16) if kr_cache is None else kr_cache
    return npu_mla_prolog_v3(
        r(t, he), w_dq, w_uq, r(n, d, hckv), w_kv, torch.ones(hcq, dtype=torch.bfloat16),
        torch.ones(hckv, dtype=torch.bfloat16), cos * 0, cos, kv_cache, kr_cache,
        cache_index=torch.tensor([0, 5, -1]), rmsnorm_epsilon_cq=1e-6, rmsnorm_epsilon_ckv=1e-6,
        cache_mode="PA_BSND", query_norm_flag=True)


def test_mla_prolog_weights_in_nd_format(contract):
    with pytest.raises(ContractViolation, match=r"npu_mla_prolog_v3: argument weight_dq: format "
                                                r"ND; the operator takes FRACTAL_NZ .*数据格式支持"
                                                r"FRACTAL_NZ"):
        _prolog(nz=False)
    query, _, _, q_norm, _ = _prolog(nz=True)             # cast once: passes
    assert query.shape == (3, 2, 128) and q_norm.shape == (3, 32)


def test_format_cast_goes_through_the_contract_and_records_nz(contract):
    h = contract()
    w = npu_format_cast(torch.randn(8, 4, dtype=torch.bfloat16), ACL_FORMAT_FRACTAL_NZ)
    assert npu_format(w) == ACL_FORMAT_FRACTAL_NZ and h.calls["npu_format_cast"] == 1


def test_sfa_caches_as_strided_views_of_one_row(contract):
    """latent | rope | indexer key side by side in one cache row (the plugin's former SFA
    layout): each cache a strided view, written in place by the prolog and the norm-rope op."""
    row = torch.zeros(2, 16, 1, 128 + 64 + 128, dtype=torch.bfloat16)
    with pytest.raises(ContractViolation, match=r"argument kv_cache: non-contiguous tensor .*"
                                                r"written in place"):
        _prolog(nz=True, kv_cache=row[..., :128], kr_cache=row[..., 128:192])
    kv = torch.randn(3, 1, 1, 128 + 64, dtype=torch.bfloat16)
    cos = torch.ones(3, 1, 1, 64, dtype=torch.bfloat16)
    with pytest.raises(ContractViolation, match=r"npu_kv_rmsnorm_rope_cache: argument "
                                                r"k_cache: non-contiguous"):
        npu_kv_rmsnorm_rope_cache(kv, torch.ones(128, dtype=torch.bfloat16), cos, cos * 0,
                                  torch.tensor([0, 1, 2]), row[..., 128:192], row[..., :128],
                                  epsilon=1e-6, cache_mode="PA")


def test_a_documentation_gap_is_counted_per_soc_and_an_unknown_one_is_a_violation(
        contract, monkeypatch):
    from vllm_ascend_ext.contract import product_gaps

    h = contract("ascend950")
    npu_dynamic_quant(torch.randn(4, 64, dtype=torch.bfloat16))      # a known gap: counted
    assert h.violations == 0 and h.doc_gaps == {"npu_dynamic_quant@A5": 1}
    assert "documentation gaps" in h.summary() and "npu_dynamic_quant@A5=1" in h.summary()
    monkeypatch.setitem(product_gaps.GAPS, "npu_dynamic_quant", {})  # not a known gap
    with pytest.raises(ContractViolation, match=r"npu_dynamic_quant: argument \*: documented for "
                                                r"A2, A3 only \(支持的型号\); the pretended SoC is "
                                                r"ascend950 \(A5\)"):
        npu_dynamic_quant(torch.randn(4, 64, dtype=torch.bfloat16))


def test_the_gap_table_covers_exactly_what_the_documentation_leaves_out():
    from vllm_ascend_ext.contract import product_gaps

    want = product_gaps.doc_gaps(TORCH_NPU_OPS)
    have = {op: sorted(f for f in routes) for op, routes in product_gaps.GAPS.items()}
    assert have == {op: sorted(fams) for op, fams in want.items()}


def test_readme_carries_the_generated_op_by_soc_table():
    from tests import readme_blocks
    from vllm_ascend_ext.contract import product_gaps
    from vllm_ascend_ext.ops.registry import TORCH_NPU_OPS as REFERENCES

    # docs/contract-mode.md, "Operators by SoC"; any page of the documentation will do.
    assert product_gaps.markdown_table(REFERENCES) in readme_blocks.all_docs_text()


@pytest.mark.parametrize("soc", ["ascend910b2", "ascend910_9391", "ascend950"])
def test_the_harness_pretends_each_soc_family(contract, soc):
    h = contract(soc)
    out, lse = _fia(key=torch.randn(NB, BS, NKV * D, dtype=torch.bfloat16))
    assert out.shape == (5, NQ, D) and lse.shape == (0,)
    npu_rms_norm(torch.randn(4, 64, dtype=torch.bfloat16), torch.randn(64, dtype=torch.bfloat16))
    assert h.calls["npu_fused_infer_attention_score"] == 1
    assert metas.Pretend.soc_version == from_name(soc).version  # what the metas read


def test_contract_mode_refuses_fp32_models():
    mode.require_npu_dtype(torch.bfloat16)
    mode.require_npu_dtype(torch.float16)
    with pytest.raises(AscendExtError, match=r"model dtype is float32 \(pass --dtype bfloat16\)"):
        mode.require_npu_dtype(torch.float32)


def test_contract_mode_value_is_validated(monkeypatch):
    monkeypatch.setenv(mode.ENV, "yes")
    with pytest.raises(Exception, match="ASCEND_EXT_NPU_CONTRACT='yes': expected 0 or 1"):
        mode.enabled()


def test_the_oracle_is_the_pinned_wheel_or_a_clear_error(monkeypatch, tmp_path):
    from vllm_ascend_ext.contract import oracle

    monkeypatch.setenv(oracle.WHEEL_ENV, str(tmp_path / "missing.whl"))
    with pytest.raises(oracle.OracleUnavailable, match="no such file"):
        oracle._wheel_path()
    other = tmp_path / oracle.WHEEL
    other.write_bytes(b"not the wheel")
    monkeypatch.setenv(oracle.WHEEL_ENV, str(other))
    with pytest.raises(oracle.OracleUnavailable, match="is not the pinned .*SHA-256"):
        oracle._wheel_path()


def test_a_call_the_official_meta_rejects_carries_its_message(contract):
    h = contract()
    with pytest.raises(ContractViolation, match=r"the official Meta kernel rejects the call: "
                                                r"numHeads should be greater than 0"):
        _fia(key=torch.randn(NB, BS, NKV * D, dtype=torch.bfloat16), num_heads=0)
    assert h.violations == 1 and "violations 1" in h.summary()


def test_the_op_counter_keeps_counting_in_contract_mode(contract):
    from vllm_ascend_ext.ops.counting import OpCounter

    x, g = torch.randn(4, 64, dtype=torch.bfloat16), torch.randn(64, dtype=torch.bfloat16)
    with OpCounter() as c:
        npu_rms_norm(x, g)
        npu_dynamic_quant(x)
    # One call each, the harness's meta run and reference hidden, as on the NPU.
    assert c.total() == {"npu_rms_norm": 1, "npu_dynamic_quant": 1}


def test_contract_mode_routes_torch_npu_call_sites_only(contract):
    from vllm_ascend_ext.ops._dispatch import pick

    cpu = torch.device("cpu")
    choose = dict(npu="npu call site", reference="reference", meta="meta")
    assert pick(cpu, **choose) == "npu call site"
    assert pick(cpu, **choose, torch_npu_op=False) == "reference"  # the plugin's own ops
    assert pick(torch.device("meta"), **choose) == "meta"


def test_moe_group_lists_must_be_int64_and_cover_the_rows(contract):
    """Groups past x's rows are a violation, and so are groups ending before them, except
    under expert parallelism (inside groups_may_end_early): there a departure from the
    docs, counted and listed, not a violation."""
    from vllm_ascend_ext.ops.grouped_matmul import groups_may_end_early, npu_grouped_matmul
    from vllm_ascend_ext.ops.moe_dispatch import npu_moe_init_routing_v2

    harness = contract()
    x, w = torch.randn(5, 64, dtype=torch.bfloat16), torch.randn(2, 64, 32, dtype=torch.bfloat16)
    kw = dict(split_item=2, group_type=0, group_list_type=1)
    npu_grouped_matmul([x], [w], group_list=torch.tensor([2, 3]), **kw)      # valid
    assert not harness.departures
    with pytest.raises(ContractViolation, match=r"npu_grouped_matmul.*group_list.*must be int64"):
        npu_grouped_matmul([x], [w], group_list=torch.tensor([2, 3], dtype=torch.int32), **kw)
    with pytest.raises(ContractViolation, match=r"group_list.*the groups hold 6 rows; x has 5"):
        npu_grouped_matmul([x], [w], group_list=torch.tensor([3, 3]), **kw)
    with pytest.raises(ContractViolation, match=r"group_list.*the groups hold 4 rows; x has 5"):
        npu_grouped_matmul([x], [w], group_list=torch.tensor([1, 3]), **kw)   # not under EP
    with groups_may_end_early():
        npu_grouped_matmul([x], [w], group_list=torch.tensor([1, 3]), **kw)  # EP: 4 of 5 rows
    assert harness.departures == {"npu_grouped_matmul: groups ending before x's rows "
                                  "(expert parallelism)": 1}
    assert harness.violations == 3
    assert "departures from the docs, made on purpose: npu_grouped_matmul" in harness.summary()
    with pytest.raises(ContractViolation, match=r"npu_moe_init_routing_v2.*expert_tokens_num_type"
                                                r".*当前仅支持1和2"):
        npu_moe_init_routing_v2(x, torch.zeros(5, 2, dtype=torch.int32), expert_num=2,
                                expert_tokens_num_type=0, expert_tokens_num_flag=True)


def _gdn_inputs(dtype=torch.bfloat16, dk=128, nk=2, nv=4, lens=(4, 1)):
    t = sum(lens)
    q, k = (torch.nn.functional.normalize(torch.randn(t, nk, dk), dim=-1).to(dtype)
            for _ in range(2))
    return (q, k, torch.randn(t, nv, dk).to(dtype), torch.rand(t, nv).to(dtype),
            -torch.rand(t, nv), torch.tensor(lens, dtype=torch.int32))


def test_gdn_calls_pass_and_equal_contract_mode_off(contract, monkeypatch):
    from vllm_ascend_ext.ops.gdn_chunk import npu_chunk_gated_delta_rule
    from vllm_ascend_ext.ops.gdn_recurrent import npu_recurrent_gated_delta_rule

    h = contract()
    q, k, v, beta, g, lens = _gdn_inputs()
    state = torch.randn(8, 4, 128, 128).to(torch.bfloat16)
    idx = torch.tensor([1, 2, 3, 4, 6], dtype=torch.int32)
    kw = dict(beta=beta, scale=128 ** -0.5, actual_seq_lengths=lens, ssm_state_indices=idx,
              num_accepted_tokens=torch.tensor([2, 1], dtype=torch.int32), g=g)
    s_on, s_off = state.clone(), state.clone()
    out_on = npu_recurrent_gated_delta_rule(q, k, v, s_on, **kw)
    init = torch.randn(2, 4, 128, 128).to(torch.bfloat16)
    chunk_on = npu_chunk_gated_delta_rule(q, k, v, beta=beta, initial_state=init,
                                          actual_seq_lengths=lens, scale=128 ** -0.5, g=g)
    assert h.violations == 0, h.summary()
    assert h.calls["npu_recurrent_gated_delta_rule"] == h.calls["npu_chunk_gated_delta_rule"] == 1
    monkeypatch.setenv(mode.ENV, "0")
    assert torch.equal(out_on, npu_recurrent_gated_delta_rule(q, k, v, s_off, **kw))
    assert torch.equal(s_on, s_off)
    chunk_off = npu_chunk_gated_delta_rule(q, k, v, beta=beta, initial_state=init,
                                           actual_seq_lengths=lens, scale=128 ** -0.5, g=g)
    assert all(torch.equal(a, b) for a, b in zip(chunk_on, chunk_off))


def test_gdn_documented_bounds_and_dtypes(contract):
    from vllm_ascend_ext.ops.gdn_chunk import npu_chunk_gated_delta_rule
    from vllm_ascend_ext.ops.gdn_recurrent import npu_recurrent_gated_delta_rule

    q, k, v, beta, g, lens = _gdn_inputs(dk=64)  # the chunk kernel takes Dk = Dv = 128 only
    with pytest.raises(ContractViolation, match=r"Dk=64, Dv=64; documented = 128"):
        npu_chunk_gated_delta_rule(q, k, v, beta=beta,
                                   initial_state=torch.zeros(2, 4, 64, 64, dtype=torch.bfloat16),
                                   actual_seq_lengths=lens, scale=0.125, g=g)
    # initial_state is documented as required (必选); the official meta fails without it
    with pytest.raises(ContractViolation, match=r"official Meta kernel rejects the call"):
        npu_chunk_gated_delta_rule(q, k, v, beta=beta, initial_state=None,
                                   actual_seq_lengths=lens, scale=0.125, g=g)
    q, k, v, beta, g, lens = _gdn_inputs(dtype=torch.float32)
    with pytest.raises(ContractViolation, match=r"argument query: dtype float32 not in bfloat16"):
        npu_recurrent_gated_delta_rule(
            q, k, v, torch.zeros(8, 4, 128, 128), beta=beta, scale=0.1, actual_seq_lengths=lens,
            ssm_state_indices=torch.arange(5, dtype=torch.int32), g=g)


def test_gdn_ops_are_documented_for_a2_a3_only(contract):
    from vllm_ascend_ext.attention.gdn.ops_table import TORCH_NPU_GDN_FAMILIES
    from vllm_ascend_ext.contract import docs

    for op in ("npu_recurrent_gated_delta_rule", "npu_chunk_gated_delta_rule"):
        assert set(docs.families(op)) == set(TORCH_NPU_GDN_FAMILIES), op
    assert set(docs.families("npu_fused_causal_conv1d")) == {"A5"}


@pytest.mark.parametrize("drafts,accepted", [(None, None), ([3, 1], [2, 1])])
def test_gdn_layer_core_calls_pass_the_contract_on_strided_hybrid_state(contract, drafts,
                                                                        accepted):
    """vLLM's hybrid pages make the recurrent state a strided view; the layer core stages
    it for the in-place recurrent kernel (contiguous only) and passes the contract with
    bf16 128-wide heads: a prefill step, then a plain decode or a ragged verify step."""
    from tests.ut.attention.gdn.test_gdn_layer import builder, cam
    from vllm_ascend_ext.attention.gdn.core import GdnDims, GdnWeights, gdn_core
    from vllm_ascend_ext.attention.gdn.ops_table import gdn_ops_for

    h = contract()
    bf, nk, nv, d, k = torch.bfloat16, 2, 4, 128, 4
    dims, dim = GdnDims(nk, nv, d, d), 2 * nk * d + nv * d
    num_spec = 0 if drafts is None else 3
    w = GdnWeights(conv_weight=(torch.randn(k, dim) / 2).to(bf), conv_bias=None,
                   a_log=torch.rand(nv) - 1, dt_bias=torch.rand(nv), silu=True)
    page = nv * d * d + 1000  # each block: conv state, then the recurrent state
    ssm = torch.zeros(12, page, dtype=bf)[:, 1000:].view(12, nv, d, d)
    conv = torch.zeros(12, dim, k - 1 + num_spec, dtype=bf).transpose(1, 2)
    table = [[1 + 4 * i + j for j in range(num_spec + 1)] for i in range(2)]
    b = builder(num_spec)
    for query, computed, dr, acc in (([5, 3], [0, 0], None if drafts is None else [-1, -1],
                                      None if drafts is None else [1, 1]),
                                     ([1, 1] if drafts is None else [4, 2], [5, 3], drafts,
                                      accepted)):
        md = b.build(0, cam(query, computed, table, "cpu"),
                     num_accepted_tokens=None if acc is None else torch.tensor(acc, dtype=torch.int32),
                     num_decode_draft_tokens_cpu=None if dr is None else torch.tensor(dr))
        n = sum(query)
        x, bb, aa = (torch.randn(n, dim).to(bf), torch.randn(n, nv).to(bf),
                     torch.randn(n, nv).to(bf))
        gdn_core(md, gdn_ops_for("A2"), dims, w, conv, ssm, x, bb, aa,
                 torch.zeros(n, nv, d, dtype=bf))
    assert h.violations == 0, h.summary()
    assert h.calls["npu_chunk_gated_delta_rule"] == 1
    assert h.calls["npu_recurrent_gated_delta_rule"] == 1
    assert not ssm.is_contiguous() and ssm[[1, 5]].abs().sum() > 0
