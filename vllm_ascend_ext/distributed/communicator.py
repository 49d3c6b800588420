"""The device communicator of both ascend_ext platforms (``AscendCommunicator``).

vLLM's ``GroupCoordinator`` hands every collective of a process group (tensor, pipeline,
data, expert parallel) to the platform's device communicator. vLLM's base class covers
all-reduce, all-gather, reduce-scatter, gather, broadcast and send/recv over the group's
``torch.distributed`` backend, but leaves out the variable-size collectives
(``all_gatherv`` / ``reduce_scatterv``) and the MoE token exchange (its
``dispatch_router_logits`` / ``combine`` are no-ops), so data parallelism with a MoE
model would be wrong on it. This class adds them:

- ``all_gatherv`` / ``reduce_scatterv``: every rank's slice padded to the largest, one
  ``all_gather_into_tensor`` / ``reduce_scatter_tensor``, the padding dropped. The sizes
  are host integers vLLM already holds (its DP metadata), so nothing is read back from
  the device, and the same code runs on HCCL (torch_npu's process group on an NPU) and on
  gloo (the emulated platform): neither takes uneven all-gathers natively.
- ``all_to_all_v``: rows with per-rank sizes (host integers) to and from every rank, one
  ``all_to_all_single``: the all-to-all token dispatcher's exchange (``moe/alltoall.py``).
- the MoE exchange for data parallelism: vLLM's all-gather / reduce-scatter manager
  (``AgRsAll2AllManager``: every DP rank gathers all ranks' tokens and router logits,
  computes its share of the experts, and the partial sums are reduce-scattered back),
  created for the groups vLLM asks it for (``use_all2all``: the EP group when DP > 1 or
  sequence-parallel MoE), and for the EP group when the plugin's MoE blocks run
  sequence-parallel under TP + EP without DP (``moe/token_split.py``).

The collectives are torch.distributed calls on the group vLLM built with the platform's
``dist_backend`` ("hccl" on the NPU platform, gloo on the emulated one): one class, one
code path. What awaits hardware: HCCL's behaviour under these calls (they are the ones
vLLM's CUDA path makes through NCCL) and HCCL's collectives inside a captured aclgraph
(docs/distributed.md).

Graph capture. vLLM 0.32's ``GroupCoordinator.graph_capture`` (entered for the TP, PP and
DP groups around every decode-graph capture) accepts only its CUDA and XPU communicators,
and from them it needs one thing: ``ca_comm``, a custom all-reduce with its own capture
context, None on XPU. The NPU has no such all-reduce: an HCCL collective issued on the
capturing stream is recorded into the aclgraph like any other kernel and replayed on the
same buffers. So this class derives from vLLM's ``XpuCommunicator`` (the communicator
whose capture needs nothing) and defines every method that class defines, each with the
base class's or its own semantics: nothing of XPU's runs here
(``tests/ut/distributed/test_communicator.py`` holds that against vLLM's class).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from vllm.distributed.device_communicators.base_device_communicator import (
    DeviceCommunicatorBase,
)
from vllm.distributed.device_communicators.xpu_communicator import XpuCommunicator

NAME = "vllm_ascend_ext.distributed.communicator.AscendCommunicator"


def _check_sizes(sizes: list[int] | None, world_size: int, what: str) -> list[int]:
    if sizes is None or len(sizes) != world_size or any(s < 0 for s in sizes):
        raise ValueError(f"{what}: sizes {sizes} must give one non-negative size per rank "
                         f"({world_size} ranks)")
    return [int(s) for s in sizes]


def _splits_without_dp() -> bool:
    """The plugin's MoE blocks split the tokens over TP without DP (``moe/token_split.py``):
    the EP group takes the MoE exchange too (a layer's all-gather steps), though vLLM asks
    for it only with DP or its own sequence-parallel MoE."""
    from vllm.config.vllm import get_current_vllm_config_or_none

    from vllm_ascend_ext.config import get_config
    from vllm_ascend_ext.moe.token_split import splits_without_dp

    config = get_current_vllm_config_or_none()     # None: a group built outside an engine
    return config is not None and splits_without_dp(config.parallel_config,
                                                    get_config(config).moe_dispatch)


class AscendCommunicator(XpuCommunicator):
    """See the module docstring (why the XPU class is the base: graph capture only)."""

    def __init__(self, cpu_group, device: torch.device | None = None, device_group=None,
                 unique_name: str = "", use_all2all: bool = False, **kwargs) -> None:
        DeviceCommunicatorBase.__init__(self, cpu_group, device, device_group, unique_name,
                                        use_all2all=use_all2all, **kwargs)
        # What vLLM's graph_capture reads: no custom all-reduce with a capture context
        self.ca_comm = None
        if not self.use_all2all and self.is_ep_communicator:
            self.use_all2all = _splits_without_dp()
        if self.use_all2all:
            from vllm.distributed.device_communicators.all2all import AgRsAll2AllManager

            self.all2all_manager = AgRsAll2AllManager(self.cpu_group)

    # -- the base class's collectives (XpuCommunicator redefines them for XPU) ----------
    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        return DeviceCommunicatorBase.all_reduce(self, input_)

    def reduce_scatter(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return DeviceCommunicatorBase.reduce_scatter(self, input_, dim)

    def gather(self, input_: torch.Tensor, dst: int = 0, dim: int = -1):
        return DeviceCommunicatorBase.gather(self, input_, dst, dim)

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        return DeviceCommunicatorBase.broadcast(self, tensor, src)

    def _fixed_rank_sum(self, input_: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("XPU's batch-invariant all-reduce: not used on the NPU")

    # -- variable-size collectives ------------------------------------------------------
    def all_gatherv(self, input_: torch.Tensor | list[torch.Tensor], dim: int = 0,
                    sizes: list[int] | None = None) -> torch.Tensor | list[torch.Tensor]:
        """Concatenate every rank's ``input_`` along ``dim`` (rank ``r`` contributes
        ``sizes[r]`` rows); a list of tensors is gathered tensor by tensor."""
        if isinstance(input_, (list, tuple)):
            return [self._all_gatherv_one(t, dim, sizes) for t in input_]
        return self._all_gatherv_one(input_, dim, sizes)

    def _all_gatherv_one(self, t: torch.Tensor, dim: int, sizes: list[int] | None):
        if self.world_size == 1:
            return t
        sizes = _check_sizes(sizes, self.world_size, "all_gatherv")
        dim = dim % t.dim()
        if t.shape[dim] != sizes[self.rank_in_group]:
            raise ValueError(f"all_gatherv: this rank's {t.shape[dim]} rows along dim {dim} "
                             f"differ from sizes[{self.rank_in_group}] = "
                             f"{sizes[self.rank_in_group]}")
        rows = t.movedim(dim, 0)
        top = max(sizes)
        padded = rows.new_zeros((top, *rows.shape[1:]))
        padded[:rows.shape[0]] = rows
        out = rows.new_empty((self.world_size * top, *rows.shape[1:]))
        dist.all_gather_into_tensor(out, padded, group=self.device_group)
        parts = [out[r * top:r * top + n] for r, n in enumerate(sizes)]
        return torch.cat(parts).movedim(0, dim).contiguous()

    def reduce_scatterv(self, input_: torch.Tensor, dim: int = -1,
                        sizes: list[int] | None = None) -> torch.Tensor:
        """Sum ``input_`` over the ranks and keep this rank's slice along ``dim`` (rank
        ``r`` keeps ``sizes[r]`` rows; ``input_`` holds ``sum(sizes)``)."""
        if self.world_size == 1:
            return input_
        if sizes is None:
            return self.reduce_scatter(input_, dim)
        sizes = _check_sizes(sizes, self.world_size, "reduce_scatterv")
        dim = dim % input_.dim()
        if input_.shape[dim] != sum(sizes):
            raise ValueError(f"reduce_scatterv: {input_.shape[dim]} rows along dim {dim}, "
                             f"sizes sum to {sum(sizes)}")
        rows = input_.movedim(dim, 0)
        top = max(sizes)
        padded = rows.new_zeros((self.world_size * top, *rows.shape[1:]))
        begin = 0
        for r, n in enumerate(sizes):
            padded[r * top:r * top + n] = rows[begin:begin + n]
            begin += n
        out = rows.new_empty((top, *rows.shape[1:]))
        dist.reduce_scatter_tensor(out, padded, group=self.device_group)
        return out[:sizes[self.rank_in_group]].movedim(0, dim).contiguous()

    # -- MoE token exchange (data parallelism) --------------------------------------------
    def _manager(self):
        if self.all2all_manager is None:
            raise RuntimeError(f"{self.unique_name}: the MoE token exchange is set up for "
                               "the expert-parallel group when vLLM asks for it "
                               "(data parallelism or sequence-parallel MoE)")
        return self.all2all_manager

    def dispatch_router_logits(self, hidden_states, router_logits,
                               is_sequence_parallel: bool = False, extra_tensors=None):
        return self._manager().dispatch_router_logits(hidden_states, router_logits,
                                                      is_sequence_parallel, extra_tensors)

    def dispatch(self, hidden_states, topk_weights, topk_ids, is_sequence_parallel: bool = False,
                 extra_tensors=None):
        return self._manager().dispatch(hidden_states, topk_weights, topk_ids,
                                        is_sequence_parallel, extra_tensors=extra_tensors)

    def combine(self, hidden_states, is_sequence_parallel: bool = False):
        return self._manager().combine(hidden_states, is_sequence_parallel)

    # -- all-to-all with per-rank sizes (the all-to-all token dispatcher, moe/alltoall.py) -
    def all_to_all_v(self, input_: torch.Tensor, out_splits: list[int],
                     in_splits: list[int]) -> torch.Tensor:
        """Rows ``input_[sum(in_splits[:r]) : ...+in_splits[r]]`` go to rank ``r``; the result
        holds ``out_splits[r]`` rows from each rank ``r``, in rank order. The sizes are host
        integers, as HCCL's AlltoAllV and ``all_to_all_single`` take them."""
        in_splits = _check_sizes(in_splits, self.world_size, "all_to_all_v in_splits")
        out_splits = _check_sizes(out_splits, self.world_size, "all_to_all_v out_splits")
        if input_.shape[0] != sum(in_splits):
            raise ValueError(f"all_to_all_v: {input_.shape[0]} rows, in_splits sum to "
                             f"{sum(in_splits)}")
        out = input_.new_empty((sum(out_splits), *input_.shape[1:]))
        if self.world_size == 1:
            out.copy_(input_)
            return out
        dist.all_to_all_single(out, input_.contiguous(), out_splits, in_splits,
                               group=self.device_group)
        return out

    # -- the MC2 operators' group name ---------------------------------------------------
    def moe_group_name(self) -> str:
        """``group_ep`` of ``npu_moe_distribute_dispatch_v2`` / ``combine_v2`` for this
        group: HCCL's communicator name on an NPU (torch_npu's process group), else a
        name the emulated operators resolve to this group (``ops/moe_distribute``)."""
        if dist.get_backend(self.device_group) == "hccl":
            # torch_npu's get_hccl_comm_name takes the process's *global* rank ("传入的rankid
            # 为全局的rankid": it picks the device, rank % devices), not the rank in the
            # group (vllm-ascend passes the latter, which names another device's
            # communicator wherever the two differ)
            backend = self.device_group._get_backend(self.device)
            return backend.get_hccl_comm_name(dist.get_rank())
        from vllm_ascend_ext.ops.moe_distribute import register_group

        name = f"ascend_ext/{self.unique_name}"
        register_group(name, self.device_group)
        return name

    def destroy(self) -> None:
        if self.all2all_manager is not None:
            self.all2all_manager.destroy()
            self.all2all_manager = None
