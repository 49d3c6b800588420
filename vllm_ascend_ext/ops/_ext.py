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


def registered_ops() -> list[str]:
    """Names of the ops the loaded library defines (empty when it is not loaded)."""
    if not load():
        return []
    import torch

    prefix = f"{NAMESPACE}::"
    return sorted({name[len(prefix):].split(".")[0]
                   for name in torch._C._dispatch_get_all_op_names() if name.startswith(prefix)})
