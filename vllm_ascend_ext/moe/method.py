"""``AscendFusedMoEMethod``: vLLM's unquantized fused-MoE method, on torch_npu's MoE operators.

Registered with ``UnquantizedFusedMoEMethod.register_oot`` while the plugin's platform is
active (``vllm_ascend_ext.register``), so every MoE layer vLLM builds without a quantized
expert method gets it: the DeepSeek-V3.2 / GLM-5 layers of the plugin's DSA model, Qwen MoE
and Qwen3-Next / Qwen3.5. Experts a ModelSlim description quantizes get
``AscendW8A8FusedMoEMethod`` (``moe/w8a8.py``), which shares ``MonolithicEntry``.

On the emulated (CPU-based) platform vLLM calls the MoE layer directly inside the compiled
model, where the references' per-expert row counts would be data-dependent shapes; the
method then enters through ``torch.ops.ascend_ext.moe_routed_experts``, an opaque custom
op (as vLLM's own ``moe_forward`` is on the NPU platform).

It is *monolithic* in vLLM's terms: it receives the router logits and routes itself
(``routing.plan_routing`` decides the gating operator once, when the layer is built;
``experts.route`` and ``experts.routed_experts`` issue the calls). vLLM's MoE runner still
runs the shared experts and adds them. Under expert parallelism (``--enable-expert-parallel``)
a rank's weights hold its experts only: the layer's shard (``expert_shard.py``) restricts
the permutation to them, and vLLM sums the ranks' shares (its all-reduce, or its DP token
exchange through the plugin's communicator), unless the layer exchanges the tokens itself
(MC2 or all-to-all, chosen per step: ``exchange`` and ``step_route.py``). Under TP + EP
without DP a layer of vLLM's MoE blocks that exchanges the tokens first splits them over
TP itself, as vLLM's modular kernel (``moe/tp_split.py``). The weights stay in vLLM's
parameters, transposed once to the kernels' ``[E, K, N]`` layout.
"""

from __future__ import annotations

import functools
import os

import torch
from vllm.logger import init_logger
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (
    UnquantizedFusedMoEMethod,
)

from vllm_ascend_ext.moe import experts
from vllm_ascend_ext.moe.alltoall import AllToAllPlan, alltoall_plan, routed_experts_alltoall
from vllm_ascend_ext.moe.expert_shard import ExpertShard, expert_shard
from vllm_ascend_ext.moe.mc2 import (
    Mc2Facts,
    Mc2Plan,
    declined,
    decode_tokens,
    mc2_plan,
    routed_experts_mc2,
    with_hccl_limit,
)
from vllm_ascend_ext.moe.routing import RoutingPlan, UnsupportedMoEError, plan_routing
from vllm_ascend_ext.moe.step_route import ALLGATHER, ALLTOALL, MC2, step_route
from vllm_ascend_ext.moe.tp_split import split_in_layer, tp_split_kernel
from vllm_ascend_ext.ops import counting

logger = init_logger("vllm.ascend_ext")


def layer_routing_plan(layer) -> RoutingPlan:
    """The routing plan of a vLLM ``RoutedExperts`` layer, or a refusal naming the feature."""
    name = getattr(layer, "layer_name", type(layer).__name__)
    moe = layer.moe_config
    activation = getattr(getattr(layer, "activation", None), "value", None)
    if activation != "silu" or not moe.is_act_and_mul:
        raise UnsupportedMoEError(f"{name}: the ascend_ext MoE method runs SiLU-gated experts "
                                  f"(npu_swiglu); this layer's activation is {activation!r}")
    clamps = {k: getattr(layer, k, None) for k in ("swiglu_limit", "swiglu_alpha", "swiglu_beta")}
    if any(v is not None for v in clamps.values()):
        shown = ", ".join(f"{k}={v}" for k, v in clamps.items() if v is not None)
        raise UnsupportedMoEError(f"{name}: the ascend_ext MoE method runs plain SwiGLU "
                                  f"(npu_swiglu); this layer clamps or scales it ({shown})")
    if moe.has_bias:
        raise UnsupportedMoEError(f"{name}: the ascend_ext MoE method does not support expert biases")
    if getattr(moe, "is_lora_enabled", False):
        raise UnsupportedMoEError(f"{name}: the ascend_ext MoE method does not support LoRA on "
                                  "MoE layers (vLLM's MoE LoRA needs a modular kernel)")
    if getattr(layer, "apply_router_weight_on_input", False):
        raise UnsupportedMoEError(f"{name}: the ascend_ext MoE method does not support router "
                                  "weights applied to the input")
    if moe.has_hash_routing:
        raise UnsupportedMoEError(f"{name}: the ascend_ext MoE method does not support hash routing")
    return plan_routing(
        layer_name=name, top_k=layer.top_k, num_experts=layer.global_num_experts,
        scoring_func=layer.scoring_func, renormalize=bool(layer.renormalize),
        use_grouped_topk=bool(layer.use_grouped_topk), num_expert_group=layer.num_expert_group,
        topk_group=layer.topk_group, has_bias=layer.e_score_correction_bias is not None,
        routed_scaling_factor=float(layer.routed_scaling_factor),
        custom_routing_function=layer.custom_routing_function)


def layer_mc2_facts(layer, shard: ExpertShard, splits: bool = False) -> Mc2Facts:
    """What the MC2 gate decides on for a vLLM ``RoutedExperts`` layer (host values);
    ``splits``: the layer splits the step's tokens over TP itself (``moe/tp_split.py``)."""
    from vllm.config import get_current_vllm_config

    from vllm_ascend_ext.config import get_config
    from vllm_ascend_ext.platform.soc import current_family

    vllm_config = get_current_vllm_config()
    moe = layer.moe_config
    par = moe.moe_parallel_config
    tokens = vllm_config.scheduler_config.max_num_batched_tokens
    split = max(getattr(par, "sp_size", 1), 1)
    if splits:
        split = vllm_config.parallel_config.tensor_parallel_size
    capture = vllm_config.compilation_config.cudagraph_capture_sizes or ()
    return with_hccl_limit(Mc2Facts(
        setting=get_config(vllm_config).moe_dispatch, family=current_family() or "A2",
        exchange=bool(par.use_all2all_kernels) or splits,
        linear=shard.is_sharded and shard.start == par.ep_rank * shard.local_experts,
        dtype=moe.in_dtype, hidden=moe.hidden_dim, top_k=layer.top_k,
        experts=layer.global_num_experts, ep_world_size=par.ep_size, ep_rank=par.ep_rank,
        capacity=-(-tokens // split),
        replicated=vllm_config.parallel_config.tensor_parallel_size > 1
        and not (moe.is_sequence_parallel or splits),
        decode_tokens=decode_tokens(vllm_config.scheduler_config,
                                    vllm_config.speculative_config, split, capture)),
        os.environ)


def layer_splits_tokens(layer) -> bool:
    """Whether a layer splits the step's tokens over TP itself (``moe/tp_split.py``)."""
    from vllm.config import get_current_vllm_config

    from vllm_ascend_ext.config import get_config

    vllm_config = get_current_vllm_config()
    return split_in_layer(get_config(vllm_config).moe_dispatch, vllm_config.parallel_config,
                          layer.moe_config)


def ep_group_name() -> str:
    """``group_ep`` of the MC2 operators: the EP group's communicator name."""
    return ep_communicator().moe_group_name()


def ep_group():
    """vLLM's expert-parallel group coordinator."""
    from vllm.distributed.parallel_state import get_ep_group

    return get_ep_group()


def ep_communicator():
    """The EP group's device communicator (the all-to-all dispatcher's exchange)."""
    return ep_group().device_communicator


def every_expert_map(layer):
    """Every EP rank's expert map for ``layer``, in rank order: one all-gather over the EP
    group's CPU group when the layer is built (every rank builds the same layers in the
    same order), never per step."""
    import torch.distributed as dist

    group = ep_group()
    mine = layer.expert_map.detach().to("cpu", torch.int32).contiguous()
    maps = [torch.empty_like(mine) for _ in range(group.world_size)]
    dist.all_gather(maps, mine, group=group.cpu_group)
    return maps


def step_tokens(x: torch.Tensor, dp_size: int) -> int:
    """The most tokens any EP rank brings to this step's MoE layers: vLLM's per-rank sizes
    of the step (host integers every rank holds alike, set around the layer's forward);
    with DP 1 and no DP metadata (TP + EP, the plugin's block splitting the tokens:
    ``moe/token_split.py``) every TP rank holds an equal share, ``x``'s rows (a host
    size: vLLM's ``sequence_parallel_chunk`` pads the step to a multiple of TP)."""
    from vllm.forward_context import get_forward_context

    dp = get_forward_context().dp_metadata
    if dp is not None:
        return max(dp.get_chunk_sizes_across_dp_rank())
    if dp_size > 1:      # each DP rank would size the step by its own tokens
        raise RuntimeError(f"an expert-parallel MoE step over {dp_size} DP ranks without "
                           "vLLM's DP metadata: the ranks cannot agree on the exchange")
    return x.shape[0]


def graph_step() -> bool:
    """Whether this step is captured into a decode graph (vLLM's runtime mode of the step,
    the same on every DP rank)."""
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import get_forward_context

    return get_forward_context().cudagraph_runtime_mode != CUDAGraphMode.NONE


def layer_expert_shard(layer) -> ExpertShard:
    """The experts this rank computes (all of them without expert parallelism)."""
    name = getattr(layer, "layer_name", type(layer).__name__)
    return expert_shard(name, getattr(layer, "expert_map", None), layer.global_num_experts,
                        layer.local_num_experts)


OP_NAMESPACE = "ascend_ext"


def run_routed_experts(x: torch.Tensor, router_logits: torch.Tensor, layer_name: str) -> torch.Tensor:
    """The body of ``torch.ops.ascend_ext.moe_routed_experts``."""
    from vllm.forward_context import get_forward_context

    layer = get_forward_context().no_compile_layers[layer_name].routed_experts
    return layer.quant_method.compute(layer, x, router_logits)


def _routed_experts_fake(x: torch.Tensor, router_logits: torch.Tensor, layer_name: str) -> torch.Tensor:
    return torch.empty_like(x)


@functools.cache
def moe_library() -> torch.library.Library:
    """Registers ``torch.ops.ascend_ext.moe_routed_experts`` on first use, a layer entry
    op of the MoE region (``ops/counting.layer_entry``)."""
    from vllm.utils.torch_utils import direct_register_custom_op

    lib = torch.library.Library(OP_NAMESPACE, "FRAGMENT")
    direct_register_custom_op("moe_routed_experts", run_routed_experts, mutates_args=[],
                              fake_impl=_routed_experts_fake, target_lib=lib)
    counting.layer_entry(f"{OP_NAMESPACE}.moe_routed_experts", run_routed_experts,
                         counting.MOE_REGION)
    return lib


class MonolithicEntry:
    """What the plugin's MoE methods share: vLLM hands them router logits (monolithic);
    they route with the plan made when the layer was built, entering through the opaque
    op where vLLM would trace them; ``compute`` is shared, each method gives its experts
    (``local_experts``, ``grouped_experts``)."""

    plan: RoutingPlan | None = None
    shard: ExpertShard | None = None
    moe_kernel = None                # vLLM's; set where the layer splits the tokens itself
    mc2: Mc2Plan | None = None       # the MC2 dispatcher's plan (moe/mc2.py)
    a2a: AllToAllPlan | None = None  # the all-to-all dispatcher's (moe/alltoall.py)
    sequence_parallel = False        # the MoE runs sequence-parallel (its exchange's argument)
    int8_rows = False                # the experts take MC2's rows quantized (W8A8)
    opaque_entry = False

    def plan_layer(self, layer) -> None:
        """Routing plan, expert shard and token exchange, made when the weights are
        created (a refusal comes before any weight is read)."""
        self.plan = layer_routing_plan(layer)
        self.shard = layer_expert_shard(layer)
        splits = layer_splits_tokens(layer)
        facts = layer_mc2_facts(layer, self.shard, splits)
        self.mc2 = mc2_plan(facts, ep_group_name)
        # all-to-all for the steps MC2 does not take (the same decision on every rank)
        self.a2a = None if self.mc2 is not None and self.mc2.every_step else alltoall_plan(
            facts, lambda: every_expert_map(layer), ep_communicator)
        # a layer that splits the tokens itself does it as vLLM's modular kernel
        # (moe/tp_split.py); its forced exchange is planned by now (a declined one raised)
        if splits:
            self.moe_kernel = tp_split_kernel(layer.moe_config,
                                              functools.partial(self.exchange, layer))
        self.sequence_parallel = bool(layer.moe_config.is_sequence_parallel) or splits
        if self.mc2 is not None and not self.mc2.every_step:
            logger.info_once("ascend_ext: expert-parallel MoE layers exchange tokens by MC2 "
                             "for steps of up to %d tokens per rank, by %s above",
                             self.mc2.tokens, "all-to-all (all-gather in graph steps)"
                             if self.a2a else "all-gather")
        elif self.a2a is not None and self.mc2 is None:
            logger.info_once("ascend_ext: expert-parallel MoE layers exchange tokens by "
                             "all-to-all (ascend_ext.moe_dispatch 'alltoall'): one host read "
                             "per MoE layer per eager step; decode-graph steps take the "
                             "all-gather")
        elif facts.exchange and self.mc2 is None:
            logger.info_once("ascend_ext: expert-parallel MoE layers exchange tokens by "
                             "all-gather / reduce-scatter: %s", "; ".join(declined(facts)))

    @property
    def supports_internal_mk(self) -> bool:
        # vLLM's runner skips its own DP token exchange for a layer whose method exchanges
        # the tokens itself (MC2, all-to-all, and the all-gather of a step-sized MC2
        # layer's larger steps), and runs it otherwise.
        return self.mc2 is not None or self.a2a is not None

    def confirm_split(self, layer) -> None:
        """After loading: a layer that splits the tokens itself still leaves the reduction
        to vLLM's runner (a block may ask for ``skip_final_all_reduce`` after building the
        layer; the runner would then refuse the reduced output at the first step)."""
        if self.moe_kernel is not None and getattr(layer.moe_config, "skip_final_all_reduce",
                                                   False):
            name = getattr(layer, "layer_name", type(layer).__name__)
            raise UnsupportedMoEError(
                f"{name}: ascend_ext.moe_dispatch asks for a token exchange, which splits "
                "this layer's tokens over TP (TP + EP without DP), but its block all-reduces "
                "the layer's output itself (skip_final_all_reduce); use 'auto' or 'allgather'")

    def place_shard(self, weight: torch.Tensor) -> None:
        """The shard's tables on the weights' device (after loading)."""
        self.shard = self.shard.to(weight.device)
        if self.a2a is not None:
            self.a2a = self.a2a.to(weight.device)
        logger.debug_once("ascend_ext: MoE layers routed by %s (%s), %s, %s", self.plan.op,
                          self.plan.describe(), self.shard.describe(),
                          "MC2 dispatch" if self.mc2 else
                          "all-to-all dispatch" if self.a2a else "no MC2")

    def compute(self, layer, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        """The layer's routed-expert sum for this rank's tokens: through the TP token
        split's kernel where the layer splits them itself (every token's complete sum on
        every TP rank, ``moe/tp_split.py``), else through the step's exchange."""
        kernel = self.moe_kernel
        if kernel is None:
            return self.exchange(layer, x, router_logits)
        out = kernel.apply_monolithic(
            x, layer.w13_weight, layer.w2_weight, router_logits, activation=layer.activation,
            global_num_experts=layer.global_num_experts, expert_map=layer.expert_map,
            apply_router_weight_on_input=False,
            e_score_correction_bias=layer.e_score_correction_bias, routing_sink=None)
        return out[:x.shape[0]]           # the step's padding to a multiple of TP

    def exchange(self, layer, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        """The layer's routed-expert sum for this rank's tokens, through the step's
        exchange (``moe/step_route.py``)."""
        route = step_route(self.mc2, self.a2a is not None,
                           lambda: step_tokens(x, layer.moe_config.dp_size), graph_step)
        if route == ALLGATHER:     # a larger step of a step-sized MC2 layer, a graph step
            x, router_logits = ep_group().dispatch_router_logits(x, router_logits,
                                                                 self.sequence_parallel)
        weights, ids = self.routed(layer, router_logits)
        if route == MC2:
            return routed_experts_mc2(x, weights, ids, self.grouped_experts(layer), self.mc2,
                                      int8_rows=self.int8_rows)
        if route == ALLTOALL:
            return routed_experts_alltoall(
                x, weights, ids, self.a2a,
                lambda rows, slots: self.local_experts(layer, rows, None, slots, None))
        out = self.local_experts(layer, x, weights, ids, self.shard)
        if route == ALLGATHER:
            out = ep_group().combine(out, self.sequence_parallel)
        return out

    def local_experts(self, layer, x: torch.Tensor, weights: torch.Tensor | None,
                      ids: torch.Tensor, shard: ExpertShard | None) -> torch.Tensor:
        """This rank's experts over its (token, k) pairs (``experts.routed_experts*``)."""
        raise NotImplementedError

    def grouped_experts(self, layer):
        """``ffn(rows, row_scales, ends, out_dtype)``: this rank's experts over rows grouped
        by expert (MC2's; ``experts.grouped_ffn*``)."""
        raise NotImplementedError

    def init_entry(self) -> None:
        from vllm.platforms import current_platform

        # vLLM traces a CPU platform's MoE layers (no moe_forward custom op around them).
        self.opaque_entry = current_platform.is_cpu()
        if self.opaque_entry:
            moe_library()

    @property
    def is_monolithic(self) -> bool:
        return True

    @property
    def supports_eplb(self) -> bool:
        return False

    def maybe_roundup_sizes(self, hidden_size, intermediate_size_per_partition, act_dtype,
                            moe_parallel_config):
        # No padding: the grouped matmul takes the model's sizes as they are.
        return hidden_size, intermediate_size_per_partition

    def get_fused_moe_quant_config(self, layer):
        return None   # no modular kernel to configure

    def routed(self, layer, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        plan = self.plan
        assert plan is not None, "the MoE method's create_weights has not run"
        return experts.route(plan, router_logits, layer.e_score_correction_bias)

    def apply_monolithic(self, layer, x: torch.Tensor, router_logits: torch.Tensor,
                         input_ids: torch.Tensor | None = None) -> torch.Tensor:
        if self.opaque_entry:
            return getattr(torch.ops, OP_NAMESPACE).moe_routed_experts(x, router_logits,
                                                                     layer.layer_name)
        return self.compute(layer, x, router_logits)

    def apply(self, layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input):
        raise AssertionError("the ascend_ext MoE methods route themselves (apply_monolithic)")


def transpose_experts(layer, *names: str) -> None:
    """vLLM loads ``[E, N, K]``; the grouped matmul takes ``[E, K, N]`` (once, after loading)."""
    for name in names:
        param = getattr(layer, name)
        param.data = param.data.transpose(1, 2).contiguous()


class AscendFusedMoEMethod(MonolithicEntry, UnquantizedFusedMoEMethod):
    """Routing and experts through ``npu_moe_*`` / ``npu_grouped_matmul`` (module docstring)."""

    def __init__(self, moe) -> None:
        super().__init__(moe)
        self.init_entry()
        # Weights are transposed after loading: a pre-processed load would be transposed twice.
        self.supports_pre_processed_weights = False

    @property
    def method_name(self) -> str:
        return "ascend_ext"

    def create_weights(self, layer, num_experts, hidden_size, intermediate_size_per_partition,
                       params_dtype, **extra_weight_attrs):
        self.plan_layer(layer)   # refuse before any weight is read
        super().create_weights(layer, num_experts, hidden_size, intermediate_size_per_partition,
                               params_dtype, **extra_weight_attrs)

    def process_weights_after_loading(self, layer) -> None:
        self.confirm_split(layer)
        transpose_experts(layer, "w13_weight", "w2_weight")
        self.place_shard(layer.w13_weight)

    def local_experts(self, layer, x, weights, ids, shard):
        return experts.routed_experts(x, weights, ids, layer.w13_weight, layer.w2_weight, shard)

    def grouped_experts(self, layer):
        return functools.partial(experts.grouped_ffn, w13=layer.w13_weight, w2=layer.w2_weight)


def register() -> None:
    """Make vLLM build this method wherever it would build its unquantized one (idempotent)."""
    from vllm.model_executor.custom_op import op_registry_oot

    key = UnquantizedFusedMoEMethod.__name__
    current = op_registry_oot.get(key)
    if current is AscendFusedMoEMethod:
        return
    if current is not None:
        raise RuntimeError(f"{key} is already replaced by {current!r}; ascend_ext will not "
                           "replace it")
    UnquantizedFusedMoEMethod.register_oot(AscendFusedMoEMethod)
