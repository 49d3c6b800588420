"""The steps both platforms run at start-up, in the order ``platform/startup.py`` runs
them: parsing, refusals, defaults. Each is idempotent and callable on its own; a step that
needs the model's facts takes the start's (``platform/facts.py``) instead of reading them
again."""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

from vllm.logger import init_logger

from vllm_ascend_ext.config import AscendExtConfig, get_config
from vllm_ascend_ext.errors import AscendExtError
from vllm_ascend_ext.platform.facts import ModelFacts, facts_of

logger = init_logger("vllm.ascend_ext")


def validate_plugin_config(vllm_config) -> AscendExtConfig:
    """Parse ``additional_config["ascend_ext"]``; raises before the engine starts."""
    return get_config(vllm_config)


def apply_quant_description(vllm_config) -> None:
    """Select the ``ascend_ext`` method when a local model holds a ModelSlim description.

    vLLM only auto-detects ``config.json``'s ``quantization_config``; an explicit
    ``--quantization`` always wins.
    """
    from vllm_ascend_ext.quantization.config import METHOD_NAME, description_path

    mc = vllm_config.model_config
    if mc is None or mc.quantization is not None:
        return
    path = description_path(mc.model)
    if path is None:
        return
    from vllm.model_executor.model_loader.weight_utils import get_quant_config

    mc.quantization = METHOD_NAME
    vllm_config.quant_config = get_quant_config(mc, vllm_config.load_config)
    logger.info("ascend_ext: %s found; quantization method %r selected", path, METHOD_NAME)


EP_ALL2ALL_BACKENDS = ("allgather_reducescatter",)


def refuse_expert_parallel(vllm_config) -> None:
    """Expert parallelism runs on vLLM's all-gather / reduce-scatter token exchange (the
    plugin's communicator); what the plugin's MoE methods do not implement is refused by
    name: expert load balancing, elastic EP and vLLM's other all-to-all backends (CUDA
    libraries)."""
    parallel = vllm_config.parallel_config
    if getattr(parallel, "enable_eplb", False):
        raise AscendExtError(
            "--enable-eplb: the ascend_ext MoE methods do not implement vLLM's EPLB "
            "interfaces (no per-expert load recording, no redundant experts, no weight "
            "rearrangement); run --enable-expert-parallel without --enable-eplb")
    if getattr(parallel, "enable_elastic_ep", False):
        raise AscendExtError(
            "--enable-elastic-ep: the ascend_ext MoE methods do not implement vLLM's elastic "
            "expert parallelism (no expert-weight migration or group rebuild on the NPU); "
            "run --enable-expert-parallel without --enable-elastic-ep")
    backend = getattr(parallel, "all2all_backend", EP_ALL2ALL_BACKENDS[0])
    if getattr(parallel, "enable_expert_parallel", False) and backend not in EP_ALL2ALL_BACKENDS:
        raise AscendExtError(
            f"--all2all-backend {backend}: the ascend_ext MoE methods exchange tokens "
            f"through the plugin's communicator; allowed: {', '.join(EP_ALL2ALL_BACKENDS)}")


_EXPERT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts")


def dispatch_gate_facts(vllm_config, family: str, experts: int):
    """What the MC2 / all-to-all gates decide on at start-up (``moe/mc2.Mc2Facts``), from
    the configuration: a layer of the model's sizes on EP rank 0, its tokens split over
    TP where the MoE runs sequence-parallel (``moe/token_split.py``: vLLM's rule, or TP +
    EP without DP with an exchange asked for, by the plugin's block or inside the layer)."""
    from vllm_ascend_ext.moe.mc2 import Mc2Facts, decode_tokens
    from vllm_ascend_ext.moe.token_split import sequence_parallel_moe

    setting = get_config(vllm_config).moe_dispatch
    par, model = vllm_config.parallel_config, vllm_config.model_config
    text = getattr(model, "hf_text_config", None) or model.hf_config
    sp = sequence_parallel_moe(par, setting)
    tokens = vllm_config.scheduler_config.max_num_batched_tokens
    split = par.tensor_parallel_size if sp else 1
    return Mc2Facts(
        setting=setting, family=family,
        exchange=bool(par.enable_expert_parallel) and (par.data_parallel_size > 1 or sp),
        linear=True, dtype=model.dtype, hidden=int(text.hidden_size),
        top_k=int(getattr(text, "num_experts_per_tok", 0) or 0), experts=experts,
        ep_world_size=par.data_parallel_size * par.tensor_parallel_size, ep_rank=0,
        capacity=-(-tokens // par.tensor_parallel_size) if sp else tokens,
        replicated=par.tensor_parallel_size > 1 and not sp,
        decode_tokens=decode_tokens(vllm_config.scheduler_config,
                                    vllm_config.speculative_config, split,
                                    vllm_config.compilation_config.cudagraph_capture_sizes
                                    or ()))


def model_experts(model_config) -> int:
    """The model's routed experts (0: no MoE layers)."""
    text = getattr(model_config, "hf_text_config", None) or model_config.hf_config
    return next((int(getattr(text, k)) for k in _EXPERT_KEYS if getattr(text, k, None)), 0)


def check_mc2_buffer(vllm_config, family: str, environ: Mapping[str, str] = os.environ):
    """Where the configuration takes MC2: the HCCL buffer its EP group needs for a decode
    step (``moe/hccl_buffer.py``), logged; with ``moe_dispatch: "mc2"`` refused when
    ``HCCL_BUFFSIZE`` is smaller, with ``auto`` a warning: the layers size their buffers
    for what it holds (``moe/mc2.with_hccl_limit``). Returns the need (None where MC2
    does not run)."""
    from vllm_ascend_ext.moe.hccl_buffer import check_buffer, configured_mb, required_buffer
    from vllm_ascend_ext.moe.mc2 import buffer_tokens, declined, with_hccl_limit

    model = vllm_config.model_config
    experts = model_experts(model) if model is not None else 0
    if not experts:
        return None
    gate = dispatch_gate_facts(vllm_config, family, experts)
    if declined(gate):
        return None
    tokens = buffer_tokens(gate)
    need = required_buffer(family, hidden=gate.hidden, top_k=gate.top_k, experts=experts,
                           ep_world=gate.ep_world_size, max_bs=tokens,
                           x_bytes=gate.dtype.itemsize, environ=environ)
    what = (f"EP {gate.ep_world_size}, {experts // gate.ep_world_size} experts per rank, "
            f"hidden {gate.hidden}, top-k {gate.top_k}, buffers for {tokens} tokens per rank: "
            f"max_num_seqs {vllm_config.scheduler_config.max_num_seqs} x (1 + speculative "
            f"tokens), at most the step budget and the SoC's bound")
    have = configured_mb(environ)
    logger.info("ascend_ext: MC2 (%s) needs HCCL_BUFFSIZE >= %d MB; it is %d MB",
                what, need.megabytes, have)
    if gate.setting == "mc2":
        check_buffer(need, environ, what)
    elif have < need.megabytes:
        fit = buffer_tokens(with_hccl_limit(gate, environ))   # what the layers will take
        logger.warning(
            "ascend_ext: HCCL_BUFFSIZE is %d MB, MC2 needs %d MB for decode steps of %d tokens "
            "per rank: %s. Set HCCL_BUFFSIZE=%d for MC2 on every decode step", have,
            need.megabytes, tokens,
            f"its buffers hold {fit} tokens per rank, larger steps take the all-gather"
            if fit else "MC2 is off, every step takes the all-gather", need.megabytes)
    return need


def refuse_forced_dispatch(vllm_config, family: str) -> None:
    """``ascend_ext.moe_dispatch: "mc2"`` or ``"alltoall"`` refused before any weight loads
    when the configuration already rules the route out (``moe/mc2.declined`` /
    ``moe/alltoall.declined`` on ``dispatch_gate_facts``: the SoC, DP/EP, dtype, the
    model's hidden size, experts and top-k, how many tokens a rank brings; a step budget
    above MC2's tokens per rank is no reason: the larger steps take another exchange);
    the MoE layers decide again, with their own sizes, when they are built."""
    from vllm_ascend_ext.moe import alltoall
    from vllm_ascend_ext.moe.mc2 import Mc2Refused, declined

    setting = get_config(vllm_config).moe_dispatch
    if setting not in ("mc2", alltoall.SETTING) or vllm_config.model_config is None:
        return
    refused = Mc2Refused if setting == "mc2" else alltoall.AllToAllRefused
    what = "MC2" if setting == "mc2" else "all-to-all"
    experts = model_experts(vllm_config.model_config)
    if not experts:
        raise refused(f"ascend_ext.moe_dispatch is {setting!r} but the model has no MoE layers")
    gate = dispatch_gate_facts(vllm_config, family, experts)
    why = declined(gate) if setting == "mc2" else alltoall.declined(gate)
    if why:
        raise refused(f"ascend_ext.moe_dispatch is {setting!r} but {what} cannot run here: "
                      + "; ".join(why) + " (use 'auto' or 'allgather')")


def refuse_sfa_block_size(cache_config) -> None:
    """A block size the user chose for an SFA model: a multiple of 16, as the indexer and
    sparse-attention kernels take it. Read before any platform set-up (vLLM's CPU platform
    replaces an MLA model's block size with its own CPU kernel's 16)."""
    from vllm_ascend_ext.attention.sfa.backend import BLOCK_SIZE_ALIGN

    if cache_config.user_specified_block_size and cache_config.block_size % BLOCK_SIZE_ALIGN:
        raise AscendExtError(
            f"ascend_ext SFA backend: block_size={cache_config.block_size} is not a multiple "
            f"of {BLOCK_SIZE_ALIGN} (the indexer / sparse-attention kernels' requirement)"
        )


SPECULATION_SERVED = ("ngram", "mtp")


def refuse_speculation_without_substitutes(spec) -> None:
    """Speculative decoding on the NPU engine (an NPU, or its CPU stand-in). Served:
    ngram (host proposer) and MTP, whose drafter's input kernels run on the plugin's
    substitutes (``worker/drafter_substitutes.py``) and whose draft layers run on the
    plugin's backends (Qwen3-Next: FIA; DeepSeek-V3.2 / GLM-5: SFA through
    ``models/dsa_mtp.py``); the rejection sampler runs on ``worker/kernel_substitutes.py``.
    The other drafter methods (EAGLE, EAGLE-3, draft models, DFlash, ...) are not verified
    on the NPU platform: refused before the engine starts."""
    if spec is None:
        return
    method = getattr(spec, "method", None) or "speculative decoding"
    if method in SPECULATION_SERVED:
        return
    raise AscendExtError(
        f"--speculative-config (method {method!r}): this drafter is not verified on the "
        f"Ascend NPU platform; serve with method {' or '.join(map(repr, SPECULATION_SERVED))} "
        "or without speculative decoding")


def sfa_block_size(cache_config) -> None:
    """An SFA model's block size when the user named none: the SFA kernels' default (128)."""
    from vllm_ascend_ext.attention.sfa.backend import DEFAULT_BLOCK_SIZE

    if not cache_config.user_specified_block_size:
        cache_config.block_size = DEFAULT_BLOCK_SIZE


def layer_ops_switch(vllm_config) -> None:
    """``ascend_ext.layer_ops`` through vLLM's custom-op switch. The plugin's layer ops are
    on unless ``compilation_config.custom_ops`` names them with ``-`` (``layers/switch.py``):
    "native" adds ``-rms_norm`` ...; "fused" adds nothing. A user's entry for one of their
    names that contradicts the choice is refused."""
    from vllm_ascend_ext.layers import custom_op_names

    choice = get_config(vllm_config).layer_ops
    other = "-" if choice == "fused" else "+"
    custom_ops = vllm_config.compilation_config.custom_ops
    clashes = [f"{other}{name}" for name in custom_op_names() if f"{other}{name}" in custom_ops]
    if clashes:
        raise AscendExtError(
            f"ascend_ext.layer_ops={choice!r} contradicts compilation_config.custom_ops "
            f"{clashes}: drop those entries, or set ascend_ext.layer_ops to "
            f"{'native' if choice == 'fused' else 'fused'!r}")
    if choice == "native":
        custom_ops.extend(f"-{name}" for name in custom_op_names()
                          if f"-{name}" not in custom_ops)


def cuda_fusion_passes_off(vllm_config) -> list[str]:
    """vLLM's post-grad fusion passes replace its layers with CUDA/ROCm/XPU kernels, and
    vLLM imports them only on those platforms: on any other its pass manager fails at the
    first compile (``NameError: RMSNormQuantFusionPass``) once the optimization level turns
    one on (``fuse_norm_quant`` follows the ``rms_norm`` custom op, which the plugin's
    layer ops enable). Every such pass is turned off; the names turned off, in order."""
    pass_config = vllm_config.compilation_config.pass_config
    names = [name for name in type(pass_config).__dataclass_fields__
             if name.startswith("fuse_") or (name.startswith("enable_")
                                              and name.endswith("_fusion"))]
    turned_off = [name for name in names if getattr(pass_config, name) is True]
    for name in turned_off:
        setattr(pass_config, name, False)
    return turned_off


def exact_host_lists_with_speculation(vllm_config) -> None:
    """Under async scheduling with speculation vLLM's ``seq_lens_cpu_upper_bound`` is only
    a bound, and FIA's host lists must be exact: async scheduling goes off (vLLM's CPU
    platform, under the emulated one, turns it off for every model)."""
    sched = vllm_config.scheduler_config
    if vllm_config.speculative_config is not None and sched.async_scheduling:
        sched.async_scheduling = False
        logger.info("ascend_ext: async scheduling off with speculative decoding (FIA takes "
                    "exact per-request lengths from the host)")


def hybrid_prefix_caching_off(vllm_config, facts: ModelFacts | None = None) -> str | None:
    """Hybrid (Gated-DeltaNet) models: prefix caching off, with the reason, where it still
    cannot work (or None).

    vLLM turns prefix caching into its "align" state-cache mode for hybrid models (0.32 has
    no other mode besides "none"): each request's state lives in the slot of the block
    holding its last computed token, the slot of every block it leaves behind is that
    block's checkpoint, and the runner's state copies run on the NPU runner's own
    (``worker/mamba_state_copy.py``, ``worker/mamba_spec_copies.py``). What stays off: a KV
    connector (P/D disaggregation), which moves KV blocks but not the plugin's GDN states,
    so a decode instance would resume from states it never received. Runs after vLLM's
    own hybrid hook, before block sizes are aligned (``update_block_size_for_backend``),
    so the "none" mode's sizes apply.
    """
    model, cache = vllm_config.model_config, vllm_config.cache_config
    if not facts_of(vllm_config, facts).hybrid:
        return None
    if not cache.enable_prefix_caching and cache.mamba_cache_mode == "none":
        return None
    if vllm_config.kv_transfer_config is None:
        return None
    cache.enable_prefix_caching = False
    if cache.mamba_cache_mode != "none":
        cache.mamba_cache_mode = "none"
        cache.mamba_block_size = model.max_model_len
    return (f"prefix caching is off for the hybrid model {model.architecture} with a KV "
            "connector: the connector transfers KV blocks, not the Gated-DeltaNet layers' "
            "conv and recurrent states that align mode checkpoints per block")


AOT_COMPILE_ENV = "VLLM_USE_AOT_COMPILE"


def compile_cache_that_loads(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """Emulated platform: vLLM's inductor compile cache instead of its AOT cache, unless the
    user chose (``VLLM_USE_AOT_COMPILE`` set); the reason, or None when nothing changed.

    vLLM 0.32 on the CPU saves the AOT-compiled model but cannot load it back (``'function'
    object has no attribute 'finalize_loading'``, logged as "Compiling model again due to a
    load failure"), so every start recompiles: 15-30 s for a tiny model on 2 cores. Its
    inductor cache (``VLLM_USE_AOT_COMPILE=0``) loads, and a second start skips the compile.
    """
    if AOT_COMPILE_ENV in environ:
        return None
    environ[AOT_COMPILE_ENV] = "0"
    return (f"{AOT_COMPILE_ENV}=0: vLLM 0.32 cannot load its own AOT compile cache on the CPU "
            "(every start would recompile); using its inductor cache, which loads. Set "
            f"{AOT_COMPILE_ENV} to choose.")
