"""The NPU's device module, and the ``torch.cuda`` names vLLM's GPU runner reaches.

vLLM's V1 GPU worker and model runner (which the NPU worker and runner subclass) reach
the device in two ways:

* ``torch.accelerator.*`` (device index, synchronize, memory statistics): device-generic,
  served on an NPU by torch_npu's registered device guard and caching allocator
  (``c10::DeviceAllocator``); nothing to do.
* a handful of ``torch.cuda.*`` names for streams and events. In an NPU worker process
  each is routed to its ``torch.npu`` counterpart once, at device init, as vLLM's own XPU
  runner does for ``torch.xpu`` (``v1/worker/xpu_model_runner.py``). Every other
  ``torch.cuda`` name those classes reach sits on a path the NPU platform keeps off
  (``CUDA_UNREACHED``), or is a device-generic alias (``CUDA_ALIASES``).
  ``tests/ut/worker/test_npu_worker_api.py`` walks vLLM's classes and holds both tables to that.

The device module is ``torch.npu`` (importing torch_npu registers it); a stand-in device
(tests; an NVIDIA GPU in the device check) passes its own module with the same names.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import types
from collections.abc import Callable, Mapping

import torch

# The device runtime this process's worker brought up (torch.npu, or the emulated
# platform's CPU stand-in); None in a process that runs no NPU worker.
_RUNTIME: list = [None]
# The kernels that runtime offers the layers by name (``FIA_OUT``, ``FIA_WORKSPACE``):
# the one registry through which the attention code reaches the device it runs on,
# filled by whoever brought the runtime up (the NPU worker: torch_npu's; the emulation
# package: its references). The attention code never asks which runtime it is.
_KERNELS: dict[str, Callable] = {}

# FIA as a graph task: the operator writing into given outputs, and its workspace query.
FIA_OUT = "fia_out"
FIA_WORKSPACE = "fia_workspace"


def set_runtime(module: types.ModuleType | None,
                kernels: Mapping[str, Callable] | None = None) -> None:
    """This process's device runtime and the kernels it offers by name."""
    _RUNTIME[0] = module
    _KERNELS.clear()
    _KERNELS.update(kernels or {})


def current_runtime() -> types.ModuleType | None:
    """The device runtime of this process's NPU worker (None without one)."""
    return _RUNTIME[0]


def runtime_kernel(name: str) -> Callable | None:
    """The kernel ``name`` the current runtime registered (None: none, or no runtime)."""
    return _KERNELS.get(name) if _RUNTIME[0] is not None else None


def torch_npu_kernels() -> dict[str, Callable]:
    """torch_npu's kernels of the registry (NPU hosts only)."""
    torch_npu = importlib.import_module("torch_npu")
    return {FIA_OUT: torch_npu.npu_fused_infer_attention_score.out,
            FIA_WORKSPACE: torch_npu._npu_fused_infer_attention_score_get_max_workspace}


# torch.cuda name -> the device module's name for the same thing (torch.npu).
CUDA_ROUTED = {
    "Stream": "Stream",
    "Event": "Event",
    "current_stream": "current_stream",
    "default_stream": "default_stream",
    "stream": "stream",
    "set_stream": "set_stream",
    # Graph capture (vLLM's CUDAGraphWrapper): decode graphs on the NPU.
    "CUDAGraph": "NPUGraph",
    "graph": "graph",
    "graph_pool_handle": "graph_pool_handle",
    "is_current_stream_capturing": "is_current_stream_capturing",
}

# torch.cuda names reached in vLLM's worker/runner source that an NPU worker never runs,
# with the fact that keeps each off the NPU path.
CUDA_UNREACHED = {
    "memory.get_allocator_backend": "Worker._scoped_allocator_max_split: only when "
                                    "current_platform.is_cuda_alike() (False on an NPU)",
    "memory._snapshot": "Worker._scoped_allocator_max_split: only when is_cuda_alike()",
    "nvtx.range": "Worker.profile: only with the CUDA profiler (profiler 'cuda'); the "
                  "NPU worker refuses it",
    "current_blas_handle": "dual-batch overlap (ubatching): refused on the NPU platform",
    "device": "the sharded RDT weight-transfer engine (CUDA IPC): not offered on an NPU",
}

# torch.cuda names that are the device-generic object under another name.
CUDA_ALIASES = {
    "OutOfMemoryError": "torch.OutOfMemoryError (raised by every device's allocator)",
}


def npu_module() -> types.ModuleType:
    """``torch.npu``: importing torch_npu registers it (only ever called on an NPU host,
    in a worker process)."""
    importlib.import_module("torch_npu")
    return torch.npu


def _event_factory(module: types.ModuleType):
    # vLLM passes CUDA's ``blocking`` keyword; torch.npu.Event takes it as well, a
    # stand-in's Event may not: keep only what the device's Event accepts.
    def make_event(*args, **kwargs):
        try:
            return module.Event(*args, **kwargs)
        except TypeError:
            kwargs.pop("blocking", None)
            kwargs.pop("interprocess", None)
            return module.Event(*args, **kwargs)

    return make_event


def _tracked_set_stream(module: types.ModuleType):
    """``set_stream`` that also keeps vLLM's current-stream record, as vLLM's own wrapper
    of ``torch.cuda.set_stream`` does (``vllm/utils/torch_utils.py``): vLLM's
    ``current_stream()`` (the stream graphs are captured on) reads that record."""
    from vllm.utils import torch_utils

    def set_stream(stream) -> None:
        torch_utils._current_stream_tls.value = stream
        module.set_stream(stream)

    return set_stream


def _tracked_stream(module: types.ModuleType, set_stream):
    """``torch.cuda.stream(s)``: a context that switches streams through ``set_stream``."""

    @contextlib.contextmanager
    def stream(s):
        if s is None:
            yield
            return
        previous = module.current_stream()
        set_stream(s)
        try:
            yield
        finally:
            set_stream(previous)

    return stream


def route_cuda_streams(module: types.ModuleType, cuda: types.ModuleType | None = None) -> dict:
    """Point each ``CUDA_ROUTED`` name of ``cuda`` (``torch.cuda``) at ``module``'s.

    Each callable gets its own ``functools.partial`` so that it is not the very object
    the device module registers (Dynamo refuses one handler registered twice). Idempotent.
    Returns ``{name: what it replaced}``.
    """
    cuda = torch.cuda if cuda is None else cuda
    replaced = {}
    set_stream = _tracked_set_stream(module)
    for name, target in CUDA_ROUTED.items():
        source = getattr(module, target)
        if name == "Event":
            value = _event_factory(module)
        elif name == "set_stream":
            value = set_stream
        elif name == "stream":
            value = _tracked_stream(module, set_stream)
        elif isinstance(source, type):
            value = source
        else:
            value = functools.partial(source)
        replaced[name] = getattr(cuda, name, None)
        setattr(cuda, name, value)
    return replaced


# vLLM's graph capture keeps weak references to the graph's outputs through
# ``torch.ops._C.weak_ref_tensor`` (``vllm/utils/torch_utils.py``), an op of vLLM's CUDA
# extension; a device-less (NPU) build of vLLM has no ``_C`` library. torch_npu provides
# the same function (``torch_npu._C._weak_ref_tensor``).
_WEAK_REF_LIBRARIES: list = []


def provide_weak_ref_tensor(weak_ref, *, namespace: str = "_C",
                            dispatch_key: str = "PrivateUse1") -> bool:
    """Define ``<namespace>::weak_ref_tensor(Tensor input) -> Tensor`` with ``weak_ref``
    for ``dispatch_key``, only where no library defines it; True if defined here."""
    if hasattr(getattr(torch.ops, namespace), "weak_ref_tensor"):
        return False
    lib = torch.library.Library(namespace, "FRAGMENT")
    lib.define("weak_ref_tensor(Tensor input) -> Tensor")
    lib.impl("weak_ref_tensor", weak_ref, dispatch_key)
    _WEAK_REF_LIBRARIES.append(lib)   # the registration lives as long as the library
    return True


def npu_weak_ref():
    """torch_npu's weak-reference function (NPU hosts only)."""
    return importlib.import_module("torch_npu")._C._weak_ref_tensor
