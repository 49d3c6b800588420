"""The one start-up policy of both platforms: parse -> refusals -> defaults -> preflight.

Each platform's ``check_and_update_config`` is ``run(vllm_config, side)``; its
:class:`Side` holds only what is its own, run at fixed places between the shared steps:

====================  =========================================================================
parse                 the plugin's options (``additional_config["ascend_ext"]``)
side.check            can the platform start here: SoC, NPU stack, contract mode -> (SoC, engine)
parse                 the model's facts (once per start), a ModelSlim description by the weights
refuse                expert load balancing, all-to-all backends other than vLLM's exchange,
                      options that reach a platform hook the NPU platform leaves undefined
                      (LoRA, the IPC weight cache, CUDA's NIC mapping: ``unanswered.py``),
                      a forced MC2 or all-to-all dispatch the configuration rules out, an
                      HCCL_BUFFSIZE smaller than the MC2 group needs
side.refuse           the platform's own refusals (NPU: dual-batch overlap, Model Runner V2)
refuse                an SFA model's block size (the user's), drafter speculation (NPU engine)
side.setup            the platform's own set-up (NPU: spawn, worker, block size; emulated:
                      worker, KV-cache size, vLLM's CPU platform)
default               hybrid prefix caching, graph mode and vLLM's CUDA fusion passes off
                      (NPU engine), SFA block size,
                      exact host lists under speculation, layer ops (vLLM's custom_ops)
preflight             the model's attention against the backend
side.finish           the platform's own last words (emulated: compile backend and cache)
====================  =========================================================================

The decisions are the steps' pure functions (``config_hooks.py``, ``graph_mode.py``,
``selection.py``); this module only orders them. ``on_step`` receives each step's name
as it starts (tests record the sequence).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vllm.logger import init_logger

from vllm_ascend_ext.platform import config_hooks as hooks
from vllm_ascend_ext.platform import facts as facts_module
from vllm_ascend_ext.platform import unanswered
from vllm_ascend_ext.platform.facts import ModelFacts
from vllm_ascend_ext.platform.selection import preflight
from vllm_ascend_ext.platform.soc import Soc

logger = init_logger("vllm.ascend_ext")


@dataclass(frozen=True)
class Start:
    """One start, as the platform's own steps after ``check`` see it."""
    vllm_config: Any
    platform_name: str
    soc: Soc
    npu_engine: bool  # the plugin's NPU worker and runner (an NPU, or its CPU stand-in)
    facts: ModelFacts


def _nothing(start: Start) -> None:
    return None


@dataclass(frozen=True)
class Side:
    """What one platform runs beside the shared steps."""
    name: str                                    # the platform, as messages name it
    check: Callable[[Any], tuple[Soc, bool]]     # its refusals first: (SoC, npu_engine)
    refuse: Callable[[Start], None] = _nothing   # its refusals beside the shared ones
    setup: Callable[[Start], None] = _nothing    # its set-up, before the shared defaults
    finish: Callable[[Start], None] = _nothing   # after the preflight


def run(vllm_config, side: Side, *, on_step: Callable[[str], None] | None = None) -> Start:
    """Check and complete ``vllm_config`` for ``side``'s platform (vLLM's
    ``check_and_update_config``); raises ``AscendExtError`` before the engine starts."""

    def step(name: str, fn: Callable, *args):
        if on_step is not None:
            on_step(name)
        return fn(*args)

    step("parse: ascend_ext options", hooks.validate_plugin_config, vllm_config)
    soc, npu_engine = step("platform: check", side.check, vllm_config)
    facts = step("parse: model facts", facts_module.model_facts,
                 vllm_config.model_config)
    start = Start(vllm_config, side.name, soc, npu_engine, facts)
    cache = vllm_config.cache_config
    step("parse: quantization description", hooks.apply_quant_description, vllm_config)

    step("refuse: EPLB, all-to-all backends", hooks.refuse_expert_parallel, vllm_config)
    step("refuse: features of unanswered platform hooks", unanswered.refuse, vllm_config)
    step("refuse: forced MC2 / all-to-all dispatch", hooks.refuse_forced_dispatch, vllm_config,
         soc.family)
    step("refuse: MC2 HCCL buffer", hooks.check_mc2_buffer, vllm_config, soc.family)
    step("platform: refuse", side.refuse, start)
    if facts.sparse_mla:
        step("refuse: SFA block size", hooks.refuse_sfa_block_size, cache)
    if npu_engine:
        step("refuse: drafter speculation", hooks.refuse_speculation_without_substitutes,
             vllm_config.speculative_config)

    step("platform: setup", side.setup, start)

    step("default: hybrid prefix caching", _hybrid_prefix_caching, vllm_config, facts)
    if npu_engine:
        step("default: graph mode", _graph_mode, vllm_config, facts)
        step("default: CUDA fusion passes off", _fusion_passes_off, vllm_config)
    if facts.sparse_mla:
        step("default: SFA block size", hooks.sfa_block_size, cache)
    step("default: exact host lists", hooks.exact_host_lists_with_speculation, vllm_config)
    step("default: layer ops", hooks.layer_ops_switch, vllm_config)

    step("preflight", preflight, side.name, soc, vllm_config, facts)
    step("platform: finish", side.finish, start)
    return start


def _hybrid_prefix_caching(vllm_config, facts: ModelFacts) -> None:
    why = hooks.hybrid_prefix_caching_off(vllm_config, facts)
    if why:
        logger.warning("ascend_ext: %s", why)


def _fusion_passes_off(vllm_config) -> None:
    names = hooks.cuda_fusion_passes_off(vllm_config)
    if names:
        logger.info("ascend_ext: vLLM's fusion passes %s off (their kernels are CUDA/ROCm/XPU "
                    "ones)", ", ".join(names))


def _graph_mode(vllm_config, facts: ModelFacts) -> None:
    # Imported here: graph_mode imports vllm.config, and the platform classes load while
    # vllm.platforms initializes (vLLM's own platforms import it lazily too).
    from vllm_ascend_ext.platform.graph_mode import apply_graph_mode

    apply_graph_mode(vllm_config, sparse=facts.sparse_mla, hybrid=facts.hybrid)
