"""The TP token split a layer of vLLM's MoE blocks runs itself under TP + EP without DP
(moe/tp_split.py), as vLLM's modular kernel: two TP ranks in two threads, their all-gather
a barrier; the result checked against the layer's function applied to every token at once,
and vLLM's runner shown to read the kernel's "output reduced"."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from vllm_ascend_ext.moe.tp_split import split_in_layer, tp_share, tp_split_kernel

# what vLLM's activation config reads from a layer's FusedMoEConfig (no clamps)
MOE = SimpleNamespace(swiglu_limit=None, swiglu_alpha=None, swiglu_beta=None,
                      activation_situ_beta=None, activation_situ_linear_beta=None)


def _layer_fn(x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """A row-wise stand-in for the layer's exchange: any per-token function will do."""
    return torch.tanh(x) * torch.softmax(logits, -1).max(-1, keepdim=True).values


def _run_ranks(x, logits, world: int):
    """Each rank's kernel output and the rows its exchange saw, ranks run concurrently."""
    shares: list[torch.Tensor | None] = [None] * world
    barrier = threading.Barrier(world, timeout=10)   # a failing rank cannot hang the other
    outs, seen = [None] * world, [[] for _ in range(world)]

    def gather(rank):
        def all_gather(t):
            shares[rank] = t
            barrier.wait()
            whole = torch.cat(shares)
            barrier.wait()
            return whole
        return all_gather

    def rank_main(rank):
        def route(rows, rows_logits):
            seen[rank].append(rows.clone())
            return _layer_fn(rows, rows_logits)
        kernel = tp_split_kernel(MOE, route, (rank, world, gather(rank)))
        outs[rank] = kernel.apply_monolithic(
            x, None, None, logits, activation=None, global_num_experts=4, expert_map=None,
            apply_router_weight_on_input=False, routing_sink=None)

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True)
               for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return outs, seen


@pytest.mark.parametrize("tokens,world", [(5, 2), (4, 2), (1, 2), (7, 4)])
def test_every_rank_gets_every_tokens_output_having_computed_only_its_share(tokens, world):
    torch.manual_seed(tokens)
    x, logits = torch.randn(tokens, 8), torch.randn(tokens, 4)
    want = _layer_fn(x, logits)
    outs, seen = _run_ranks(x, logits, world)
    rows = -(-tokens // world)
    for rank in range(world):
        # every share gathered, the step's padding rows (the caller drops them) at the end
        assert outs[rank].shape[0] == rows * world
        torch.testing.assert_close(outs[rank][:tokens], want, rtol=0, atol=0)
        assert [s.shape[0] for s in seen[rank]] == [rows]
        # its own rows, in order; the step's padding rows are zeros
        start = rank * rows
        real = x[start:start + rows]
        torch.testing.assert_close(seen[rank][0][:real.shape[0]], real)
        assert not seen[rank][0][real.shape[0]:].any()


def test_the_share_follows_vllms_sequence_parallel_chunk():
    x = torch.arange(10.0).reshape(5, 2)
    assert tp_share(x, 0, 2).tolist() == [[0, 1], [2, 3], [4, 5]]
    assert tp_share(x, 1, 2).tolist() == [[6, 7], [8, 9], [0, 0]]
    assert tp_share(x, 0, 1).tolist() == x.tolist()


def _runner(moe_kernel, scale: float = 1.0):
    """vLLM's MoE runner around a layer whose method holds ``moe_kernel``, the expert
    computation replaced by fixed outputs (shared 1, routed 10)."""
    import torch.nn as nn
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

    runner = MoERunner.__new__(MoERunner)
    nn.Module.__init__(runner)
    runner.moe_config = SimpleNamespace(is_sequence_parallel=False, tp_size=2, ep_size=2,
                                        skip_final_all_reduce=False, hidden_dim=4,
                                        hidden_dim_unpadded=4)
    runner.routed_input_transform = runner.routed_output_transform = runner.router = None
    runner.routed_scaling_factor = scale
    runner._shared_experts = object()
    runner.routed_experts = SimpleNamespace(quant_method=SimpleNamespace(
        moe_kernel=moe_kernel, skip_forward_padding=False, has_unpadded_output=False))
    runner._forward_entry = lambda *a: (torch.full((3, 4), 1.0), torch.full((3, 4), 10.0))
    runner._encode_layer_name = lambda: "layer"
    return runner


@pytest.mark.parametrize("scale", [1.0, 2.0])
def test_vllms_runner_all_reduces_only_the_shared_experts_of_a_split_layer(monkeypatch, scale):
    """Two TP ranks holding equal values: the stand-in all-reduce doubles what it gets.
    With the split's kernel only the shared experts' partial sum is reduced (2 x 1) and the
    routed output, complete on every rank, is not (10, scaled); without a kernel vLLM
    reduces the sum (2 x (1 + 10 x scale))."""
    from vllm.model_executor.layers.fused_moe.runner import moe_runner

    reduced: list[torch.Tensor] = []

    def all_reduce(t):
        reduced.append(t.clone())
        return t * 2

    monkeypatch.setattr(moe_runner, "tensor_model_parallel_all_reduce", all_reduce)
    kernel = tp_split_kernel(MOE, _layer_fn, (0, 2, lambda t: t))
    assert kernel.output_is_reduced() and kernel.is_monolithic
    out = _runner(kernel, scale).forward(torch.zeros(3, 4), torch.zeros(3, 2))
    assert torch.equal(out, torch.full((3, 4), 2 * 1.0 + 10.0 * scale))
    assert [t[0, 0].item() for t in reduced] == [1.0]
    reduced.clear()
    out = _runner(None, scale).forward(torch.zeros(3, 4), torch.zeros(3, 2))
    assert torch.equal(out, torch.full((3, 4), 2 * (1.0 + 10.0 * scale)))
    assert [t[0, 0].item() for t in reduced] == [1.0 + 10.0 * scale]
    # negative control (the e2e one, moved here): the split's kernel reporting its output
    # unreduced makes vLLM all-reduce every rank's complete routed copy as well
    reduced.clear()
    monkeypatch.setattr(type(kernel), "output_is_reduced", lambda self: False)
    out = _runner(kernel, scale).forward(torch.zeros(3, 4), torch.zeros(3, 2))
    assert torch.equal(out, torch.full((3, 4), 2 * (1.0 + 10.0 * scale)))


def test_a_split_layer_whose_block_reduces_its_output_itself_is_refused_after_loading():
    from vllm_ascend_ext.moe.method import MonolithicEntry
    from vllm_ascend_ext.moe.routing import UnsupportedMoEError

    method = MonolithicEntry()
    layer = SimpleNamespace(layer_name="model.layers.0.mlp.experts",
                            moe_config=SimpleNamespace(skip_final_all_reduce=True))
    method.confirm_split(layer)              # no kernel: the layer does not split
    method.moe_kernel = tp_split_kernel(MOE, _layer_fn, (0, 2, lambda t: t))
    with pytest.raises(UnsupportedMoEError, match=r"model.layers.0.mlp.experts: .*"
                                                  r"skip_final_all_reduce"):
        method.confirm_split(layer)
    layer.moe_config.skip_final_all_reduce = False
    method.confirm_split(layer)


def _par(tp=2, dp=1, ep=True):
    return SimpleNamespace(tensor_parallel_size=tp, data_parallel_size=dp,
                           enable_expert_parallel=ep, prefill_context_parallel_size=1)


def _moe(sp=False, skip=False):
    return SimpleNamespace(is_sequence_parallel=sp, skip_final_all_reduce=skip)


def test_a_layer_splits_only_where_its_block_hands_it_every_token_and_an_exchange_is_asked():
    assert split_in_layer("alltoall", _par(), _moe())
    assert split_in_layer("mc2", _par(), _moe())
    assert not split_in_layer("mc2", _par(), _moe(sp=True))      # the block split them
    # a block that all-reduces the layer's output itself would sum complete copies
    assert not split_in_layer("mc2", _par(), _moe(skip=True))
    for setting in ("auto", "allgather"):
        assert not split_in_layer(setting, _par(), _moe())
    for par in (_par(tp=1), _par(dp=2), _par(ep=False)):
        assert not split_in_layer("alltoall", par, _moe())
