"""torch_npu's official Meta kernels, run on a CPU without torch_npu or CANN.

The oracle's ``_meta_registrations.py`` registers Meta implementations with
``Library("npu", "IMPL", "Meta")``. Here it is executed with its imports answered by
small stand-ins, so that nothing of this reaches the rest of the process:

- the ``npu`` namespace becomes the private ``ascend_ext_oracle`` (schemas defined there
  from the yaml), so no ``torch.ops.npu`` operator exists afterwards and a real
  torch_npu in the same process is never shadowed;
- its ``aten`` Meta overrides (``matmul_backward``, ``_convolution``) go nowhere;
- ``has_side_effect`` (an FX registry) does nothing;
- ``torch_npu`` is a plain object carrying the few names the file uses: the runtime's
  SoC and CANN versions (those the harness is told to pretend: the metas branch on
  them), its extra dtypes (never equal to a torch dtype), and its error-code helpers
  (the oracle's own ``_error_code.py``). ``sys.modules["torch_npu"]`` is never touched:
  a spec-less module there breaks every ``find_spec``-based NPU probe.
"""

from __future__ import annotations

import builtins
import functools
import types
from typing import Any

import torch

from vllm_ascend_ext.contract import oracle, schemas

NAMESPACE = "ascend_ext_oracle"
DEFAULT_CANN_VERSION = "8.5.0"


class Pretend:
    """The runtime facts the official metas read (set by the harness per call)."""

    soc_version = 221          # torch_npu get_soc_version(): Ascend 910B2 (A2)
    cann_version = DEFAULT_CANN_VERSION


def _version_tuple(version: str):
    """CANN versions ordered as releases are: ``8.5.0.alpha003`` < ``8.5.0`` (a release is
    newer than its pre-releases), ``8.3.RC1`` < ``8.5.0``."""
    from packaging.version import Version

    return Version(version.replace("-", "."))


class _Sink:
    """A Library whose registrations go nowhere (the file's aten overrides)."""

    def impl(self, *args, **kwargs):
        return None


def _library_shim(library_ns):
    real = torch.library

    def make_library(ns, kind, dispatch_key=""):
        if ns == "npu":
            return real.Library(library_ns, kind, dispatch_key)
        return _Sink()

    def impl(lib, name, dispatch_key=""):
        if isinstance(lib, _Sink):
            return lambda fn: fn
        return real.impl(lib, name, dispatch_key) if dispatch_key else real.impl(lib, name)

    shim = types.ModuleType("torch.library")
    shim.Library, shim.impl = make_library, impl
    return shim


class _TorchProxy:
    """``torch`` as the file sees it: ``torch.ops.npu`` is the private namespace."""

    def __init__(self, ops_ns: str) -> None:
        self._ops_ns = ops_ns

    def __getattr__(self, name: str) -> Any:
        if name == "ops":
            return _OpsProxy(self._ops_ns)
        return getattr(torch, name)


class _OpsProxy:
    def __init__(self, ns: str) -> None:
        self._ns = ns

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.ops, self._ns if name == "npu" else name)


def _torch_npu_standin(error_codes: types.ModuleType) -> types.SimpleNamespace:
    def npu_dtype(name):
        return types.SimpleNamespace(name=f"torch_npu.{name}")  # equal to no torch dtype

    utils = types.SimpleNamespace(
        get_cann_version=lambda module="CANN": Pretend.cann_version,
        _is_gte_cann_version=lambda version, module="CANN": (
            _version_tuple(Pretend.cann_version) >= _version_tuple(version)),
    )
    backends = types.SimpleNamespace(get_soc_version=lambda: Pretend.soc_version)
    return types.SimpleNamespace(
        npu=types.SimpleNamespace(utils=utils, _backends=backends),
        utils=types.SimpleNamespace(_error_code=error_codes,
                                    utils=types.SimpleNamespace(
                                        _is_interactive_command_line=lambda: False)),
        float8_e4m3fn=torch.float8_e4m3fn, float8_e5m2=torch.float8_e5m2, uint8=torch.uint8,
        **{name: npu_dtype(name) for name in (
            "hifloat8", "int4", "float4_e2m1fn_x2", "float4_e1m2fn_x2", "float4_e2m1",
            "float4_e1m2", "float8_e8m0fnu")},
    )


def _exec(source: str, filename: str, modules: dict[str, Any]) -> dict[str, Any]:
    """Execute ``source`` with imports of ``modules``' names answered from ``modules``."""

    def _import(name, globals=None, locals=None, fromlist=(), level=0):
        if name in modules:
            if fromlist:
                return modules[name]
            return modules[name.split(".")[0]]
        return builtins.__import__(name, globals, locals, fromlist, level)

    env = {"__name__": filename, "__builtins__": {**vars(builtins), "__import__": _import}}
    exec(compile(source, filename, "exec"), env)  # noqa: S102 - the pinned oracle's own file
    return env


def _as_module(name: str, env: dict[str, Any]) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update({k: v for k, v in env.items() if not k.startswith("__")})
    return module


@functools.cache
def load() -> torch.library.Library:
    """Define every yaml schema in the private namespace and register the official
    Meta kernels there, once per process; the returned Library keeps them alive."""
    files = oracle.load()
    lib = torch.library.Library(NAMESPACE, "DEF")
    for s in schemas.all_schemas().values():
        lib.define(s.text)
    errors_env = _exec(files[oracle.ERROR_CODES], oracle.ERROR_CODES, {
        "torch_npu": types.SimpleNamespace(), "torch_npu.utils.utils": types.SimpleNamespace(
            _is_interactive_command_line=lambda: False)})
    standin = _torch_npu_standin(_as_module("torch_npu.utils._error_code", errors_env))
    _exec(files[oracle.METAS], oracle.METAS, {
        "torch": _TorchProxy(NAMESPACE),
        "torch_npu": standin,
        "torch.library": _library_shim(NAMESPACE),
        "torch.fx.node": types.SimpleNamespace(has_side_effect=lambda op: None),
        "torch_npu.utils._error_code": standin.utils._error_code,
        "torch_npu.npu.utils": standin.npu.utils,
        "torch_npu.npu._backends": standin.npu._backends,
    })
    return lib


def op(name: str, overload: str = "default"):
    """The private-namespace overload whose Meta kernel is the official one."""
    load()
    return getattr(getattr(getattr(torch.ops, NAMESPACE), name), overload)


def has_meta(name: str) -> bool:
    """Whether the oracle defines ``name`` and registers an official Meta kernel for it."""
    load()
    if name not in {s.name for s in schemas.all_schemas().values()}:
        return False
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"{NAMESPACE}::{name}", "Meta")
