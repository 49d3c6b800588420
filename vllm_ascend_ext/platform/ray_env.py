"""What emulation needs in a Ray worker before it imports vLLM.

vLLM's Ray executor starts each worker as a Ray actor and resolves the platform there
while the actor imports vLLM; the driver's environment reaches the actor only later
(``RayWorkerProc.initialize_worker``). On an NPU that is fine: the platform is found from
torch_npu. In emulation the platform is chosen by ``ASCEND_EXT_EMULATE``, so the driver's
``ASCEND_EXT_*`` variables (emulation, the chip to pretend, contract mode, ...) travel in
the actors' Ray runtime environment, which Ray applies before the actor's first import.
"""

from __future__ import annotations

from collections.abc import Mapping

PREFIX = "ASCEND_EXT_"


def with_plugin_env(runtime_env: Mapping | None, environ: Mapping[str, str]) -> dict:
    """``runtime_env`` (vLLM's ``parallel_config.ray_runtime_env``, or None) as a plain
    dict with the ``ASCEND_EXT_*`` variables of ``environ`` added to its ``env_vars``;
    a value the runtime environment sets already is kept."""
    merged = {k: v for k, v in dict(runtime_env or {}).items()}
    env_vars = dict(merged.get("env_vars") or {})
    for key, value in environ.items():
        if key.startswith(PREFIX):
            env_vars.setdefault(key, value)
    merged["env_vars"] = env_vars
    return merged
