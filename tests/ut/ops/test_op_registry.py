"""Each operator declared once (``ops/op_record.NpuOp`` in its module, collected by
``ops/registry.py``) and read from there by the dispatch, the contract harness and doctor;
contract mode installs itself into the dispatch; FIA's signature is spelt once."""

from __future__ import annotations

import ast
import importlib.util
import inspect
from pathlib import Path

import pytest
import torch

from vllm_ascend_ext import envs
from vllm_ascend_ext.contract import mode, op_rules
from vllm_ascend_ext.contract.harness import ContractViolation
from vllm_ascend_ext.errors import AscendExtError
from vllm_ascend_ext.ops import _dispatch, _ext, counting, fia, fia_checks, registry
from vllm_ascend_ext.ops.op_record import NpuOp

OPS_DIR = Path(registry.__file__).parent


def _record_names(module) -> dict[str, str]:
    """Operator name -> the module-level name of its record."""
    return {value.name: name for name, value in vars(module).items() if isinstance(value, NpuOp)}


def test_the_registry_holds_each_operator_the_plugin_calls_once():
    assert len(registry.TORCH_NPU_OPS) == 28
    assert set(registry.OPERATORS) - set(registry.TORCH_NPU_OPS) == {
        "npu_causal_conv1d_ext", "npu_recurrent_gated_delta_rule_ext", "npu_mla_prolog_v3_k3"}
    declared = sum(len(_record_names(m)) for m in registry.MODULES)
    assert declared == len(registry.OPERATORS)
    modules = {p.stem for p in OPS_DIR.glob("*.py")}
    with_records = {m.__name__.rsplit(".", 1)[-1] for m in registry.MODULES}
    assert with_records <= modules
    for stem in modules - with_records:   # the helpers declare no operator
        source = (OPS_DIR / f"{stem}.py").read_text()
        assert "NpuOp(" not in source or stem == "op_record", stem


def test_every_entry_is_tagged_with_its_counted_name_and_dispatches_through_its_record():
    entries = registry.entries()
    for module in registry.MODULES:
        for op_name, var in _record_names(module).items():
            op = getattr(module, var)
            if not op.counted_once:
                assert op.counted_as not in entries
                continue
            entry = entries[op.counted_as]
            assert entry.__module__ == module.__name__
            assert f"{var}.pick(" in inspect.getsource(entry), (op_name, entry.__name__)
    assert set(entries) == {op.counted_as for op in registry.OPERATORS.values()
                            if op.counted_once}
    assert "FIA.pick(" in inspect.getsource(fia.npu_fused_infer_attention_score)


def test_no_operator_module_picks_an_implementation_by_hand():
    for path in OPS_DIR.glob("*.py"):
        if path.stem in ("_dispatch", "op_record"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "pick":
                pytest.fail(f"{path.name}:{node.lineno}: pick(...) outside its record")


def test_records_name_their_emulation_and_their_compiled_kernels_exist():
    scatter = registry.OPERATORS["npu_scatter_pa_kv_cache"]
    assert scatter.reference.__name__ == "scatter_pa_kv_cache_reference"
    assert scatter.emulated.__name__ == "scatter_pa_kv_cache_emulated"
    norm = registry.OPERATORS["npu_rms_norm"]
    assert norm.emulated.__name__ == "rms_norm_emulated" and norm.kernel == "emu_rms_norm"
    gmm = registry.OPERATORS["npu_grouped_matmul"]   # no compiled kernel: the reference
    assert gmm.emulated is gmm.reference and gmm.kernel is None
    kernels = {op.kernel for op in registry.OPERATORS.values() if op.kernel}
    assert "emu_fused_infer_attention_score" in kernels
    if _ext.load():
        assert kernels <= set(_ext.registered_ops())
    own = registry.OPERATORS["npu_causal_conv1d_ext"]
    assert own.counted_as == f"{_ext.NAMESPACE}.npu_causal_conv1d_ext" and not own.torch_npu


def test_contract_rules_are_found_through_the_group_each_record_names():
    by_group = {}
    for op in registry.TORCH_NPU_OPS.values():
        if op.rules is None:
            assert op_rules.rules_for(op) == ()
            continue
        found = op_rules.rules_for(op)
        assert found and all(r.op == op.name for r in found), op.name
        by_group.setdefault(op.rules, set()).add(op.name)
    for group, rules in op_rules.GROUPS.items():
        assert {r.op for r in rules} == by_group[group], group   # no rule of an unknown op
    assert {op.name for op in registry.TORCH_NPU_OPS.values() if op.rules is None} == {
        "npu_format_cast", "npu_interleave_rope", "npu_add_rms_norm"}
    assert not any(op.rules for op in registry.OPERATORS.values() if not op.torch_npu)


def test_the_fia_block_size_rule_uses_the_shared_limits():
    source = inspect.getsource(op_rules._fia_block_size)
    assert "MAX_BLOCK_SIZE" in source and "512" not in source
    assert fia_checks.KERNEL_BLOCK_SIZES[-1] == fia_checks.MAX_BLOCK_SIZE
    from vllm_ascend_ext.attention.fia.backend import AscendFIABackend

    assert AscendFIABackend.get_supported_kernel_block_sizes() == [128, 256, 384, 512]


def test_paged_prefill_takes_multiples_of_128_and_decode_multiples_of_16():
    """FIA's two documented block-size readings: every paged call 16-aligned up to 512; a
    paged call with a query longer than one token (TND: from the cumulative ends) a
    multiple of 128 in [128, 512]."""
    from vllm_ascend_ext.contract.rules import Call

    def problems(block_size: int, ends: list[int]) -> list[str]:
        t = ends[-1]
        values = dict(query=torch.zeros(t, 2, 64, dtype=torch.bfloat16),
                      key=torch.zeros(4, block_size, 128, dtype=torch.bfloat16),
                      block_table=torch.zeros(len(ends), 1, dtype=torch.int32),
                      input_layout="TND", actual_seq_lengths=ends,
                      actual_seq_lengths_kv=[1] * len(ends), block_size=block_size)
        call = Call(op=op_rules.FIA, values=values, soc="ascend910b2", family="A2", mutable=())
        return [("prefill" if "128的倍数" in r.quote else "any") for r in op_rules.FIA_RULES
                if r.argument == "block_size" and r.check(call)]

    assert problems(128, [1, 2, 3]) == problems(128, [1, 9]) == []
    assert problems(512, [7]) == problems(256, [7]) == []
    assert problems(16, [1, 2, 3]) == []                  # decode only: 16-aligned is enough
    assert problems(16, [1, 9]) == ["prefill"]     # an 8-token query: paged prefill
    assert problems(272, [40]) == ["prefill"]
    assert problems(24, [1, 2]) == ["any"]


def test_the_harness_computes_with_the_record_and_refuses_an_undeclared_operator(contract):
    h = contract()
    with pytest.raises(ContractViolation, match="npu_not_declared: the plugin has no reference"):
        h.namespace.npu_not_declared(torch.ones(1))


def test_dispatch_asks_the_stand_in_contract_mode_installs(monkeypatch):
    monkeypatch.setattr(_dispatch, "_STAND_IN", [])
    monkeypatch.setenv(envs.NPU_CONTRACT, "1")
    with pytest.raises(AscendExtError, match=r"no torch_npu stand-in is installed.*"
                                             r"contract\.mode\.enabled\(\)"):
        _dispatch.torch_npu_module()
    stand_in = object()
    monkeypatch.setattr(mode, "_HARNESS", [type("H", (), {"namespace": stand_in})()])
    assert mode.enabled() is True
    assert _dispatch.torch_npu_module() is stand_in
    monkeypatch.setenv(envs.NPU_CONTRACT, "0")
    assert mode.enabled() is False
    if importlib.util.find_spec("torch_npu") is None:   # off an NPU host: the real import
        with pytest.raises(ImportError):
            _dispatch.torch_npu_module()


def test_the_contract_variable_is_read_in_envs_with_its_message(monkeypatch):
    assert mode.ENV == envs.NPU_CONTRACT == "ASCEND_EXT_NPU_CONTRACT"
    monkeypatch.setenv(envs.NPU_CONTRACT, " 1 ")
    assert envs.npu_contract() is True
    monkeypatch.setenv(envs.NPU_CONTRACT, "true")
    with pytest.raises(AscendExtError, match="ASCEND_EXT_NPU_CONTRACT='true': expected 0 or 1"):
        envs.npu_contract()


def test_fia_signature_is_spelt_once_with_torch_npus_defaults():
    from vllm_ascend_ext.contract import schemas

    for fn in (fia.fia_reference, fia.fia_emulated, fia.fia_meta, fia.fia_npu,
               fia.npu_fused_infer_attention_score):
        assert list(inspect.signature(fn).parameters) == ["query", "key", "value", "kwargs"]
    official = {p.name: p for p in schemas.schema(fia.OP).params}
    for name, default in fia_checks.FIA_KEYWORDS.items():
        assert official[name].has_default and official[name].default == default, name
    assert set(fia_checks.UNSUPPORTED_OPTIONALS) <= set(official)
    with pytest.raises(TypeError, match=r"unexpected arguments \['num_head'\]"):
        fia_checks.FIAArgs.of({"num_head": 4})
    args = fia_checks.FIAArgs.of({"num_heads": 4, "pse_shift": None})
    assert args.num_heads == 4 and args.sparse_mode == 0 and args.optionals == {"pse_shift": None}


def test_layer_entry_ops_are_declared_by_their_owners_where_they_register_them():
    """No table in ops/ names them: registering each layer's custom op declares it, and
    the op counter and the emulated graph capture find the same body."""
    from vllm_ascend_ext.attention.gdn.layer import gdn_forward_library
    from vllm_ascend_ext.attention.sfa.layer import sfa_forward_library
    from vllm_ascend_ext.emulation import cpu_npu_graph
    from vllm_ascend_ext.moe.method import moe_library

    for register in (sfa_forward_library, gdn_forward_library, moe_library):
        register()
    expected = {
        "ascend_ext.sfa_forward": ("vllm_ascend_ext.attention.sfa.layer:run_sfa_forward",
                                   counting.ATTENTION_REGION),
        "ascend_ext.gdn_forward": ("vllm_ascend_ext.attention.gdn.layer:run_gdn_forward",
                                   counting.ATTENTION_REGION),
        "ascend_ext.moe_routed_experts": ("vllm_ascend_ext.moe.method:run_routed_experts",
                                          counting.MOE_REGION),
    }
    entries = registry.layer_entries()
    assert {name: (e["body"], e["region"]) for name, e in entries.items()} == expected
    for name, entry in counting.LAYER_ENTRIES.items():
        namespace, op = name.split(".")
        packet = getattr(getattr(torch.ops, namespace), op)
        assert str(packet) == name
        assert cpu_npu_graph.python_op(packet.default) is entry.body
    for path in OPS_DIR.glob("*.py"):     # no "module:function" strings pointing up either
        source = path.read_text()
        assert "vllm_ascend_ext.attention" not in source and "vllm_ascend_ext.moe" not in source


def test_doctor_lists_every_declared_operator():
    described = registry.describe()
    assert set(described) == set(registry.OPERATORS)
    fia_line = described["npu_fused_infer_attention_score"]
    assert fia_line["kind"] == "torch_npu" and fia_line["contract_rules"] == "FIA_RULES"
    assert fia_line["kernel"]["name"] == "emu_fused_infer_attention_score"


def test_sfa_cache_layers_get_their_backend_from_the_parent_layer():
    from vllm.config import VllmConfig, set_current_vllm_config

    from vllm_ascend_ext.attention.sfa.backend import AscendSFABackend, AscendSFACacheBackend
    from vllm_ascend_ext.attention.sfa.caches import SfaCacheLayer

    assert AscendSFABackend.get_cache_backend_cls() is AscendSFACacheBackend
    with set_current_vllm_config(VllmConfig()):
        layer = SfaCacheLayer(width=64, kv_cache_dtype="auto", prefix="m.0.k_rope_cache",
                              backend=AscendSFABackend.get_cache_backend_cls())
    assert layer.get_attn_backend() is AscendSFACacheBackend
    assert not hasattr(layer, "attn_backend")
