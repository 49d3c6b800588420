"""An expert-parallel MoE layer inside one of vLLM's MoE blocks that splits the step's
tokens over TP itself: vLLM's monolithic modular kernel, the split as its prepare and
finalize, the layer's token exchange as its experts.

Under TP + EP without DP vLLM's MoE blocks (Qwen MoE, Qwen3-Next / Qwen3.5) hand every TP
rank the same tokens, and its MoE runner all-reduces the layer's partial sums over TP
(vLLM runs them sequence-parallel only with DP: ``moe/token_split.py``). When
``ascend_ext.moe_dispatch`` asks for a token exchange (``"mc2"`` or ``"alltoall"``) the
plugin's MoE method (``moe/method.py``) splits the tokens inside the layer instead:

- **prepare**: this TP rank's ``ceil(T / TP)`` rows of the tokens and of their router
  logits, the step padded with zero rows to a multiple of TP (the rule of vLLM's
  ``sequence_parallel_chunk``, which the plugin's own DeepSeek block applies before the
  layer);
- **experts**: the layer's token exchange over those rows (MC2, all-to-all, or the
  all-gather a step-sized MC2 layer takes for its larger steps: ``moe/step_route.py``);
- **finalize**: an all-gather over TP (the caller drops the padding rows): every rank
  holds every token's complete routed output, so the kernel reports
  ``output_is_reduced()``. vLLM's runner then all-reduces only the shared experts' TP
  partial sums (their weights stay sliced over TP, as vLLM built them) and skips the
  all-reduce of the routed output.

What that moves per layer (``benchmarks/moe_exchange_bytes.py``): an all-gather of the
routed output and the exchange of each rank's share, against the all-reduce of all of
it; a model with shared experts adds their all-reduce. The kernel is built only in that
layout (``split_in_layer``); vLLM's runner reads nothing else from it that changes the
layer (its experts are monolithic: the method routes itself).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from vllm.model_executor.layers.fused_moe import modular_kernel as mk
from vllm.model_executor.layers.fused_moe.config import FUSED_MOE_UNQUANTIZED_CONFIG


def tp_share(x: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Rank ``rank``'s ``ceil(T / world)`` rows of ``x`` (``T`` rows), zero rows padding
    the step to a multiple of ``world``."""
    rows = -(-x.shape[0] // world)
    pad = rows * world - x.shape[0]
    y = F.pad(x, (0, 0, 0, pad)) if pad else x
    return y.narrow(0, rank * rows, rows).contiguous()


def split_in_layer(moe_dispatch: str, parallel_config, moe_config) -> bool:
    """The layer splits the tokens itself: TP + EP without DP with a token exchange asked
    for (``token_split.splits_without_dp``), in a block that hands it every token (vLLM's
    ``FusedMoEConfig.is_sequence_parallel`` unset) and leaves the reduction to vLLM's
    runner (a block that all-reduces the layer's output itself, ``skip_final_all_reduce``,
    would add up every rank's complete copy)."""
    from vllm_ascend_ext.moe.token_split import splits_without_dp

    return (not moe_config.is_sequence_parallel
            and not getattr(moe_config, "skip_final_all_reduce", False)
            and splits_without_dp(parallel_config, moe_dispatch))


class TpTokenSplit(mk.FusedMoEPrepareAndFinalizeMonolithic):
    """prepare: this TP rank's share of the tokens; finalize: every rank's shares
    all-gathered (``all_gather(t)``: the TP group's concatenation along rows), the step's
    padding rows still at the end (no state kept between the two: the caller, who holds
    the step's tokens, drops them)."""

    def __init__(self, rank: int, world: int,
                 all_gather: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.rank, self.world, self.all_gather = rank, world, all_gather

    @property
    def activation_format(self) -> mk.FusedMoEActivationFormat:
        return mk.FusedMoEActivationFormat.Standard

    def topk_indices_dtype(self) -> torch.dtype | None:
        return None

    def max_num_tokens_per_rank(self) -> int | None:
        return None

    def num_dispatchers(self) -> int:
        return self.world

    def output_is_reduced(self) -> bool:
        return True

    def prepare(self, a1: torch.Tensor, router_logits: torch.Tensor, quant_config,
                defer_input_quant: bool = False):
        return (tp_share(a1, self.rank, self.world), None,
                tp_share(router_logits, self.rank, self.world))

    def finalize(self, fused_expert_output: torch.Tensor) -> torch.Tensor:
        return self.all_gather(fused_expert_output)


class LayerExchange(mk.FusedMoEExpertsMonolithic):
    """The plugin's MoE layer over this rank's share: ``route(x, router_logits)``, the
    method's exchange bound to its layer. It quantizes its own inputs (W8A8 per token,
    MC2's int8 rows), so the prepare step passes them unquantized."""

    def __init__(self, moe_config, route: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
        super().__init__(moe_config, FUSED_MOE_UNQUANTIZED_CONFIG)
        self.route = route

    @staticmethod
    def activation_format() -> mk.FusedMoEActivationFormat:
        return mk.FusedMoEActivationFormat.Standard

    @property
    def expects_unquantized_inputs(self) -> bool:
        return True

    # vLLM's kernel oracle never picks this class (the plugin's method builds it): what
    # the layer supports is decided by the method's own refusals (moe/method.py)
    @staticmethod
    def _supports_current_device() -> bool:
        return True

    @staticmethod
    def _supports_no_act_and_mul() -> bool:
        return False

    @staticmethod
    def _supports_quant_scheme(weight_key, activation_key) -> bool:
        return True

    @staticmethod
    def _supports_activation(activation) -> bool:
        return getattr(activation, "value", activation) == "silu"

    @staticmethod
    def _supports_parallel_config(moe_parallel_config) -> bool:
        return True

    @staticmethod
    def _supports_routing_method(routing_method, weight_key, activation_key) -> bool:
        return True

    @staticmethod
    def _supports_router_logits_dtype(router_logits_dtype, routing_method) -> bool:
        return True

    def apply(self, hidden_states, w1, w2, router_logits, activation, global_num_experts,
              expert_map, a1q_scale, apply_router_weight_on_input, num_expert_group=None,
              e_score_correction_bias=None, routed_scaling_factor=None, topk_group=None,
              routing_replay_out=None) -> torch.Tensor:
        return self.route(hidden_states, router_logits)


def tp_split_kernel(moe_config, route: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                    tp: tuple[int, int, Callable[[torch.Tensor], torch.Tensor]] | None = None
                    ) -> mk.FusedMoEKernel:
    """The layer's kernel; ``tp``: the split's (rank, world, all-gather), the TP group's
    unless given."""
    if tp is None:
        from vllm.distributed import (
            get_tensor_model_parallel_rank,
            get_tensor_model_parallel_world_size,
            tensor_model_parallel_all_gather,
        )

        tp = (get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size(),
              lambda t: tensor_model_parallel_all_gather(t, 0))
    return mk.FusedMoEKernel(TpTokenSplit(*tp), LayerExchange(moe_config, route))
