"""Every operator the plugin calls, as its module declares it (``ops/op_record.NpuOp``).

The records are collected from the operator modules below, never written twice: the
contract harness computes a torch_npu operator with its record's emulation and checks
it with the rules the record names, doctor lists them, the tests check that every entry
function dispatches through its record. Importing this module imports every operator
module (nothing in the hot path imports it).

The op counter's *layer entry ops* (``ascend_ext.sfa_forward`` ...: wrappers the counter
enters instead of counting) are not operators of this table: their owners declare them
where they register them (``ops/counting.layer_entry``); ``layer_entries`` lists those
declared in this process so far.
"""

from __future__ import annotations

from types import ModuleType

from vllm_ascend_ext.ops import (
    _ext,
    add_rms_norm,
    add_rms_norm_quant,
    causal_conv1d,
    counting,
    dequant_swiglu_quant,
    fia,
    format,
    gdn_chunk,
    gdn_ext,
    gdn_recurrent,
    grouped_matmul,
    grouped_matmul_swiglu_quant,
    kv_cache,
    kv_rmsnorm_rope_cache,
    lightning_indexer,
    mla_prolog,
    mla_prolog_k3,
    moe_dispatch,
    moe_distribute,
    moe_gating,
    mrope,
    norm,
    quant,
    rope,
    sparse_flash_attention,
    top_k_top_p,
)
from vllm_ascend_ext.ops.op_record import NpuOp

MODULES: tuple[ModuleType, ...] = (
    add_rms_norm, add_rms_norm_quant, causal_conv1d, dequant_swiglu_quant, fia, format, gdn_chunk, gdn_ext, gdn_recurrent,
    grouped_matmul, grouped_matmul_swiglu_quant, kv_cache, kv_rmsnorm_rope_cache, lightning_indexer, mla_prolog, mla_prolog_k3, moe_dispatch,
    moe_distribute, moe_gating, mrope, norm, quant, rope, sparse_flash_attention, top_k_top_p,
)


class DuplicateOperator(RuntimeError):
    """Two records declare one operator."""


def _collect() -> dict[str, NpuOp]:
    """Operator name -> its record, every operator module's, sorted by name."""
    found: dict[str, NpuOp] = {}
    for module in MODULES:
        for value in vars(module).values():
            if isinstance(value, NpuOp):
                if found.setdefault(value.name, value) is not value:
                    raise DuplicateOperator(f"{value.name}: declared twice")
    return dict(sorted(found.items()))


OPERATORS: dict[str, NpuOp] = _collect()
# The torch_npu operators the plugin calls (what contract mode checks).
TORCH_NPU_OPS: dict[str, NpuOp] = {name: op for name, op in OPERATORS.items() if op.torch_npu}


def entries() -> dict[str, object]:
    """Counted name -> the entry function the layers call (tagged ``counting.npu_op``),
    for every tagged function of the operator modules."""
    out: dict[str, object] = {}
    for module in MODULES:
        for value in vars(module).values():
            name = getattr(value, "npu_op_name", None)
            if name is not None and getattr(value, "__module__", None) == module.__name__:
                out[name] = value
    return out


def layer_entries() -> dict[str, dict[str, str]]:
    """The op counter's layer entry ops declared in this process (their owners declare
    them when they register the op): name -> the body it counts and its region."""
    return {name: {"body": f"{e.body.__module__}:{e.body.__qualname__}", "region": e.region}
            for name, e in sorted(counting.LAYER_ENTRIES.items())}


def describe() -> dict[str, dict]:
    """One line of facts per operator (doctor): its kind, where it is declared, its
    compiled kernel and whether the loaded library has it, its contract rules."""
    compiled = set(_ext.registered_ops())
    out = {}
    for name, op in OPERATORS.items():
        out[name] = {
            "kind": "torch_npu" if op.torch_npu else f"plugin ({_ext.NAMESPACE})",
            "module": op.reference.__module__,
            "kernel": None if op.kernel is None else {"name": op.kernel,
                                                      "loaded": op.kernel in compiled},
            "counted_once": op.counted_once,
            "contract_rules": (op.rules or "schema, official meta and products only")
                              if op.torch_npu else "not checked (the plugin's own op)",
        }
    return out
