"""Every device name the NPU worker, runner and plugin reach exists in the pinned torch_npu.

Read from torch-npu 2.13.0's own files (the contract oracle: an installed torch_npu's
files, or the pinned wheel), never by importing it:

* each ``torch.npu.*`` / ``torch_npu.npu.*`` name in the plugin's code, each name the
  plugin reads off the device module (``self.device.*``, ``dev.*``) and each routing
  target is bound in ``torch_npu/npu/__init__.py``;
* each ``torch_npu.*`` operator is a registration schema of the wheel (``.out``
  overloads included) or a name the wheel binds on ``torch_npu``;
* each ``torch.cuda.*`` name reached through vLLM's worker, runner and graph wrapper
  methods the plugin inherits is routed to ``torch.npu``, a device-generic alias, or
  on a path the NPU platform keeps off (``worker/npu_device.py`` names the fact);
* each ``torch.accelerator.*`` call reached exists in torch 2.13 and dispatches to what
  the wheel's ``libtorch_npu.so`` registers: a device guard and a ``c10::DeviceAllocator``.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest
import torch

from tests.ut import api_reach
from vllm_ascend_ext.contract import oracle
from vllm_ascend_ext.worker import npu_device

PACKAGE = Path(__file__).resolve().parents[3] / "vllm_ascend_ext"


@functools.cache
def npu_exports() -> frozenset[str]:
    """Names ``torch.npu`` (torch_npu.npu) has: bound at the top of its ``__init__``."""
    tree = ast.parse(oracle.read_member("torch_npu/npu/__init__.py"))
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names.add(target.id)
                    if target.id == "__all__":
                        names.update(e.value for e in node.value.elts)
    return frozenset(names)


@functools.cache
def torch_npu_exports() -> frozenset[str]:
    """Operators of the registration yaml (``name`` and ``name.overload``), plus every
    ``torch_npu.<name> = ...`` binding in the wheel's Python files, plus ``npu``."""
    names = {"npu"}
    for m in re.finditer(r"^- func: ([\w.]+)\(", oracle.load()[oracle.SCHEMAS], re.M):
        names.add(m.group(1))
        names.add(m.group(1).split(".")[0])
    binding = re.compile(r"^\s*torch_npu\.(\w+)\s*=", re.M)
    members = [m for m in oracle.python_members()
               if m.startswith("torch_npu/") and "/testing/" not in m]
    for text in oracle.read_members(members).values():
        names.update(binding.findall(text.decode("utf-8", "ignore")))
    return frozenset(names)


def _plugin_trees():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text(encoding="utf-8"))


def _chains(tree, prefixes):
    return {c for node in ast.walk(tree) if isinstance(node, ast.Attribute)
            for c in [api_reach.chain(node)] if c and c.startswith(prefixes)}


def _module_results(tree):
    """``torch_npu_module().<name>`` / ``npu_module().<name>``."""
    return {node.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name) and node.value.func.id.endswith("_module")}


def test_every_torch_npu_name_the_plugin_uses_is_in_the_pinned_wheel():
    used_npu, used_ops = {}, {}
    for path, tree in _plugin_trees():
        rel = str(path.relative_to(PACKAGE.parent))
        for c in _chains(tree, ("torch.npu.", "torch_npu.npu.")):
            used_npu.setdefault(c.split(".")[2], rel)
        for c in _chains(tree, ("torch_npu.",)):
            parts = c.split(".")
            if parts[1] != "npu":
                op = parts[1] + (f".{parts[2]}" if parts[2:3] == ["out"] else "")
                used_ops.setdefault(op, rel)
        for name in _module_results(tree):
            used_ops.setdefault(name, rel)
        device_prefix = {"graph_tasks.py": "self.device.", "npu_worker.py": "dev."}.get(path.name)
        if device_prefix:
            for c in _chains(tree, (device_prefix,)):
                used_npu.setdefault(c[len(device_prefix):].split(".")[0], rel)
    for target in npu_device.CUDA_ROUTED.values():
        used_npu.setdefault(target, "worker/npu_device.py CUDA_ROUTED")
    # What the walk must have found (it would pass vacuously on an empty scan).
    assert {"graph_task_update_begin", "ExternalEvent", "NPUGraph", "set_device",
            "max_memory_allocated"} <= set(used_npu)
    assert {"npu_fused_infer_attention_score.out",
            "_npu_fused_infer_attention_score_get_max_workspace",
            "npu_scatter_pa_kv_cache", "npu_format_cast", "get_npu_format"} <= set(used_ops)
    missing_npu = {n: where for n, where in used_npu.items() if n not in npu_exports()}
    missing_ops = {n: where for n, where in used_ops.items() if n not in torch_npu_exports()}
    assert not missing_npu, f"not in torch_npu {oracle.VERSION}'s torch.npu: {missing_npu}"
    assert not missing_ops, f"not in torch_npu {oracle.VERSION}: {missing_ops}"


def test_the_export_check_rejects_a_name_the_wheel_lacks():
    assert "graph_task_update_begin" in npu_exports()
    assert "graph_task_update_beginning" not in npu_exports()
    assert "npu_fused_infer_attention_score.out" in torch_npu_exports()
    assert "npu_fused_infer_attention_score.inplace" not in torch_npu_exports()


def _reached():
    from vllm.distributed.parallel_state import GroupCoordinator

    from vllm_ascend_ext.worker.npu_graph import AscendNPUGraphWrapper
    from vllm_ascend_ext.worker.npu_model_runner import AscendNPUModelRunner
    from vllm_ascend_ext.worker.npu_worker import AscendNPUWorker

    found: dict[str, set[str]] = {}
    # GroupCoordinator: its graph_capture is entered by the runner's capture_model
    # (reached through a return value, which the walk does not follow by itself).
    for cls in (AscendNPUWorker, AscendNPUModelRunner, AscendNPUGraphWrapper,
                GroupCoordinator):
        for name, where in api_reach.reach(cls).items():
            found.setdefault(name, set()).update(where)
    return found


@functools.cache
def _reached_cached():
    return _reached()


def test_every_torch_cuda_name_reached_is_routed_aliased_or_kept_off_the_npu_path():
    found = _reached_cached()
    cuda = {n.removeprefix("torch.cuda."): w for n, w in found.items()
            if n.startswith("torch.cuda.")}
    # module prefixes of longer chains (torch.cuda.memory, torch.cuda.nvtx) are not calls
    leaves = {n: w for n, w in cuda.items()
              if not any(other.startswith(n + ".") for other in cuda)}
    # Found through the runner's own load_model override calling vLLM's (super()):
    assert {"Stream", "Event", "current_stream", "CUDAGraph", "graph", "set_stream",
            "current_blas_handle"} <= set(leaves)
    known = (set(npu_device.CUDA_ROUTED) | set(npu_device.CUDA_UNREACHED)
             | set(npu_device.CUDA_ALIASES))
    unknown = {n: sorted(w)[:3] for n, w in leaves.items() if n not in known}
    assert not unknown, ("torch.cuda names reached through inherited vLLM methods that the "
                         f"NPU worker neither routes nor accounts for: {unknown}")
    for name in npu_device.CUDA_ALIASES:
        assert getattr(torch.cuda, name) is getattr(torch, name)


# torch.accelerator functions -> what serves them for PrivateUse1 (the NPU).
GUARD = "device guard (c10::impl::DeviceGuardImplInterface, registered by torch_npu)"
ALLOCATOR = "caching allocator (a c10::DeviceAllocator torch_npu installs with SetAllocator)"
ACCELERATOR_BACKING = {
    "device_count": GUARD, "is_available": GUARD, "current_accelerator": GUARD,
    "current_device_index": GUARD, "set_device_index": GUARD, "current_stream": GUARD,
    "synchronize": GUARD,
    "empty_cache": ALLOCATOR, "memory_stats": ALLOCATOR, "memory_reserved": ALLOCATOR,
    "memory_allocated": ALLOCATOR, "reset_peak_memory_stats": ALLOCATOR,
    "get_memory_info": ALLOCATOR, "max_memory_allocated": ALLOCATOR,
}
# Mangled names the wheel's library must reference for each kind of backing.
LIBRARY_EVIDENCE = {
    GUARD: [b"_ZN3c104impl24DeviceGuardImplRegistrarC1ENS_10DeviceTypeEPKNS0_24DeviceGuard"
            b"ImplInterfaceE"],
    ALLOCATOR: [b"_ZN3c1012SetAllocatorENS_10DeviceTypeEPNS_9AllocatorEh",
                b"_ZN3c1015DeviceAllocatorC2Ev", b"getMemoryInfo", b"resetPeakStats",
                b"getDeviceStats", b"emptyCache"],
}


@pytest.fixture(scope="module")
def libtorch_npu() -> bytes:
    return oracle.read_member("torch_npu/lib/libtorch_npu.so")


def test_every_torch_accelerator_call_reached_is_served_by_the_wheels_library(libtorch_npu):
    found = _reached_cached()
    calls = {n.removeprefix("torch.accelerator."): w for n, w in found.items()
             if n.startswith("torch.accelerator.")}
    assert {"empty_cache", "synchronize", "memory_stats", "get_memory_info"} <= set(calls)
    unbacked = {n: sorted(w)[:3] for n, w in calls.items() if n not in ACCELERATOR_BACKING}
    assert not unbacked, f"torch.accelerator calls with no known NPU backing: {unbacked}"
    for name in calls:
        assert callable(getattr(torch.accelerator, name)), name
    for backing in {ACCELERATOR_BACKING[n] for n in calls}:
        for symbol in LIBRARY_EVIDENCE[backing]:
            assert symbol in libtorch_npu, f"{backing}: {symbol!r} not in libtorch_npu.so"
    assert b"_ZN3c1015DeviceAllocatorC2Ev_not_a_symbol" not in libtorch_npu


def test_weak_ref_tensor_is_provided_only_where_no_library_defines_it():
    import torch

    import vllm_ascend_ext.worker.npu_device as nd

    # a namespace without it (as a device-less vLLM build's _C; vLLM's CPU build has none
    # either): defined once, and vLLM's call form reaches the given function; a second
    # call (or a library that defines it, as vLLM's CUDA build does) is left alone
    calls = []

    def weak_ref(t):
        calls.append(t.data_ptr())
        return t.view_as(t)

    ns = "_ascend_ext_test_weak_ref"
    assert nd.provide_weak_ref_tensor(weak_ref, namespace=ns, dispatch_key="CPU") is True
    assert nd.provide_weak_ref_tensor(weak_ref, namespace=ns, dispatch_key="CPU") is False
    x = torch.arange(4.0)
    y = getattr(torch.ops, ns).weak_ref_tensor(x)
    assert y.data_ptr() == x.data_ptr() and calls == [x.data_ptr()]
