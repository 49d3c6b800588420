"""The plugin's compiled op library ``vllm_ascend_ext._C_ascend_ext`` (``csrc/``), if built.

``load()`` imports it once; importing registers ``torch.ops._C_ascend_ext.*`` (CPU and
Meta kernels, plus NPU kernels in a CANN build). When the library is missing (no
compiler at install time) the plugin says so once and uses its Python references.
"""

from __future__ import annotations

import importlib
import logging

NAMESPACE = "_C_ascend_ext"
MODULE = f"vllm_ascend_ext.{NAMESPACE}"
_logger = logging.getLogger("vllm.ascend_ext")
_state: dict[str, bool] = {}


def load() -> bool:
    """True when the compiled library is loaded (its ops are in torch.ops._C_ascend_ext)."""
    if "loaded" not in _state:
        try:
            importlib.import_module(MODULE)
            _state["loaded"] = True
        except ImportError as exc:
            _logger.warning(
                "ascend_ext: the compiled op library %s is not available (%s); using the "
                "Python reference implementations of its ops", MODULE, exc)
            _state["loaded"] = False
    return _state["loaded"]


def loaded() -> bool:
    """Whether the library is loaded, without trying to load it."""
    return _state.get("loaded", False)


def report_if_missing() -> bool:
    """At plugin start: warn (once per process) when the library was not built.

    pip hides the build's own banner unless ``-v``; this line is what a user sees.
    Checks for the module file only (does not load the library).
    """
    import importlib.util

    present = importlib.util.find_spec(MODULE) is not None
    if not present and not _state.get("reported"):
        _state["reported"] = True
        _logger.warning(
            "ascend_ext: the compiled op library %s was not built (no C++ compiler or no "
            "torch at install time?); its ops run on Python references. Reinstall with "
            "README's install command to build it.", MODULE)
    return present


def registered_ops() -> list[str]:
    """Names of the ops the loaded library defines (empty when it is not loaded)."""
    if not load():
        return []
    import torch

    prefix = f"{NAMESPACE}::"
    return sorted({name[len(prefix):].split(".")[0]
                   for name in torch._C._dispatch_get_all_op_names() if name.startswith(prefix)})
