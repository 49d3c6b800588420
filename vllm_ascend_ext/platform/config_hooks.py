"""Config checks both platforms run in ``check_and_update_config`` (idempotent)."""

from __future__ import annotations

from vllm_ascend_ext.config import AscendExtConfig, get_config


def validate_plugin_config(vllm_config) -> AscendExtConfig:
    """Parse ``additional_config["ascend_ext"]``; raises before the engine starts."""
    return get_config(vllm_config)
