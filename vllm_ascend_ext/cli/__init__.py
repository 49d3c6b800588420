"""``python -m vllm_ascend_ext`` (or ``vllm-ascend-ext``): vLLM's whole CLI plus the plugin's
own commands. See :mod:`vllm_ascend_ext.cli.entry`."""

from vllm_ascend_ext.cli.entry import main

__all__ = ["main"]
