"""The CPU stand-in of the NPU runtime (emulation/cpu_npu.py, emulation/cpu_npu_graph.py).

Graphs are held to NPU semantics: a replay re-reads the buffers written outside the graph,
keeps host values frozen at capture, refuses host reads during capture, and changes a
captured FIA call's host lists only through a graph-task update. The FIA tests capture the
plugin's own attention impl and builder through the stand-in and compare replays with
dense attention (tests/ut/dense.py) over each step's own lengths.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from vllm.config import CUDAGraphMode
from vllm.forward_context import set_forward_context

from tests.ut.attention.fia.test_fia_graph_tasks import (
    CAPTURED,
    KEY,
    NB,
    NEXT,
    NKV,
    NQ,
    TABLE_A,
    TABLE_B,
    D,
    _builder,
    _cam,
    _padded_cam,
    _step,
    _wrapper_config,
)
from vllm_ascend_ext.attention.fia.graph_tasks import FiaGraphTasks, update_before_replay
from vllm_ascend_ext.attention.fia.impl import AscendFIAImpl
from vllm_ascend_ext.emulation import cpu_npu
from vllm_ascend_ext.emulation.cpu_npu_graph import GraphCaptureError
from vllm_ascend_ext.ops import fia
from vllm_ascend_ext.ops.fia_checks import FIAArgumentError
from vllm_ascend_ext.worker.npu_warmup import warmup_sizes


@pytest.fixture
def rt():
    return cpu_npu.make_runtime()


def test_replay_rereads_buffers_and_keeps_host_values_of_the_capture(rt):
    x = torch.tensor([1.0, 2.0, 3.0])           # a buffer written outside the graph
    out = torch.zeros(3)
    g = rt.NPUGraph()
    n = 10                                       # a host value at capture
    with rt.graph(g):
        assert rt.is_current_stream_capturing()
        y = (x * 2).to(torch.float64)            # functional ops; to() that copies
        z = y.view(3) + torch.tensor([float(n)], dtype=torch.float64)
        out.copy_(z)                             # an in-place write
        ids = x.long()
        emb = torch.nn.functional.embedding(ids, torch.arange(20.0).view(10, 2))
    assert not rt.is_current_stream_capturing()
    x.copy_(torch.tensor([4.0, 5.0, 6.0]))
    n = 1000                                     # noqa: F841 - not seen by the replay
    g.replay()
    assert out.tolist() == [18.0, 20.0, 22.0]    # 2x + 10: the capture's host value
    assert emb.tolist() == [[8.0, 9.0], [10.0, 11.0], [12.0, 13.0]]
    assert g.replays == 1


@pytest.mark.parametrize("read", [
    lambda t: t.sum().item(),
    lambda t: bool(t[0] > 0),
    lambda t: t[t > 1.5],                        # a data-dependent shape
])
def test_a_host_read_during_capture_is_refused(rt, read):
    # (``.tolist()`` / ``.cpu()`` / ``.numpy()`` of a CPU tensor never reach the
    # dispatcher: the stand-in cannot see those; docs/engine-path.md says so.)
    x = torch.tensor([1.0, 2.0])
    with pytest.raises(GraphCaptureError, match="host"):
        with rt.graph(rt.NPUGraph()):
            read(x * 1)
    assert not rt.is_current_stream_capturing()


def test_an_unknown_python_custom_op_is_refused_not_recorded(rt):
    lib = torch.library.Library("vllm", "FRAGMENT")
    lib.define("ascend_ext_test_unknown(Tensor x) -> Tensor")
    lib.impl("ascend_ext_test_unknown", lambda x: x * 2, "CPU")
    with pytest.raises(GraphCaptureError, match="ascend_ext_test_unknown"):
        with rt.graph(rt.NPUGraph()):
            torch.ops.vllm.ascend_ext_test_unknown(torch.ones(2))


def test_a_task_update_replaces_only_that_tasks_calls(rt):
    x = torch.ones(3)
    out_a, out_b = torch.zeros(3), torch.zeros(3)
    g = rt.NPUGraph()
    with rt.graph(g):
        rt.graph_task_group_begin(rt.current_stream())
        out_a.copy_(x * 2)
        handle = rt.graph_task_group_end(rt.current_stream())
        out_b.copy_(x * 3)
    rt.graph_task_update_begin(rt.current_stream(), handle)
    out_a.copy_(x * 7)                           # re-issued with a new host value
    rt.graph_task_update_end(rt.current_stream())
    x.fill_(2.0)
    g.replay()
    assert out_a.tolist() == [14.0] * 3 and out_b.tolist() == [6.0] * 3
    assert handle.updates == 1 and len(g.tasks()) == 1


def test_an_update_defers_a_kernel_to_replay_and_refuses_a_meta_that_disagrees(rt):
    """An NPU operator re-issued by an update runs its meta there (checks, outputs without
    data); the replay computes it into those outputs, and a meta whose outputs the kernel
    does not produce is named at the replay instead of being cast or dropped silently."""
    from vllm_ascend_ext.emulation.cpu_npu_graph import GraphCaptureError, as_kernel

    calls = []

    def kernel(x, k):
        calls.append(k)
        return x * k

    def meta(x, k):
        return torch.empty_like(x)

    def wrong_meta(x, k):
        return torch.empty(x.shape[0] + 1)

    x, out = torch.ones(3), torch.zeros(3)
    g = rt.NPUGraph()
    with rt.graph(g):
        rt.graph_task_group_begin(rt.current_stream())
        out.copy_(as_kernel(kernel, meta)(x, 2.0))
        handle = rt.graph_task_group_end(rt.current_stream())
    calls.clear()
    rt.graph_task_update_begin(rt.current_stream(), handle)
    out.copy_(as_kernel(kernel, meta)(x, 5.0))
    rt.graph_task_update_end(rt.current_stream())
    assert calls == []                            # issued, not computed
    x.fill_(3.0)
    g.replay()
    assert calls == [5.0] and out.tolist() == [15.0] * 3
    rt.graph_task_update_begin(rt.current_stream(), handle)
    out.copy_(as_kernel(kernel, wrong_meta)(x, 5.0)[:3])
    rt.graph_task_update_end(rt.current_stream())
    with pytest.raises(GraphCaptureError, match="its meta gave outputs"):
        g.replay()


# -- FIA decode graphs through the stand-in ---------------------------------------------------

def _capture_fia(rt, n_layers=2):
    tasks = FiaGraphTasks(rt, fia.npu_fused_infer_attention_score_out, fia.fia_max_workspace)
    builder = _builder(tasks)
    kv_cache = torch.zeros(NB, NKV, 16, 2 * D)
    q, k, v, _ = _step(CAPTURED, TABLE_A, kv_cache, seed=0)
    md = builder.build(0, _cam(CAPTURED, TABLE_A))
    layers = [AscendFIAImpl(NQ, D, D**-0.5, NKV) for _ in range(n_layers)]
    outs = [torch.zeros_like(q) for _ in layers]
    g = rt.NPUGraph()
    with set_forward_context({"layer.0": md}, _wrapper_config(),
                             cudagraph_runtime_mode=CUDAGraphMode.FULL, batch_descriptor=KEY):
        with rt.graph(g):
            for layer, out in zip(layers, outs):
                layer.forward(None, q, k, v, kv_cache, md, out)
    return g, tasks, builder, (q, k, v), kv_cache, outs


def _load_next(builder, static, kv_cache, lens=NEXT, padded=None):
    q, k, v, expected = _step(lens, TABLE_B, kv_cache, seed=1)
    for buf, new in zip(static, (q, k, v)):
        buf.zero_()
        buf[:len(lens)].copy_(new)
    cam = _cam(lens, TABLE_B) if padded is None else _padded_cam(lens, TABLE_B, padded)
    return builder.build(0, cam), expected


def test_a_replayed_fia_graph_computes_the_updated_steps_attention(rt):
    g, tasks, builder, static, kv_cache, outs = _capture_fia(rt)
    assert len(g.tasks()) == 2                   # one FIA task per layer
    md, expected = _load_next(builder, static, kv_cache)
    assert update_before_replay({"layer.0": md}, KEY) == 2
    g.replay()
    for out in outs:
        torch.testing.assert_close(out.view(len(NEXT), NQ, D), expected, atol=1e-5, rtol=1e-5)


def test_an_update_reissues_the_task_and_the_kernel_computes_only_at_replay(rt, monkeypatch):
    """As torch_npu's update re-issues a task without launching it: the update runs the
    operator's checks (its shape-only implementation), the replay computes it once."""
    runs = []

    def counted(*args, **kwargs):
        runs.append(1)
        return fia.fia_emulated(*args, **kwargs)

    monkeypatch.setattr(fia, "FIA", dataclasses.replace(fia.FIA, emulation=counted))
    g, tasks, builder, static, kv_cache, outs = _capture_fia(rt)
    md, expected = _load_next(builder, static, kv_cache)
    runs.clear()
    assert update_before_replay({"layer.0": md}, KEY) == 2
    assert runs == []                            # re-issued, not computed
    g.replay()
    assert len(runs) == 2                        # one computation per layer's task
    for out in outs:
        torch.testing.assert_close(out.view(len(NEXT), NQ, D), expected, atol=1e-5, rtol=1e-5)


def test_negative_control_without_the_update_a_replay_waits_or_keeps_the_captured_lengths(rt):
    g, tasks, builder, static, kv_cache, outs = _capture_fia(rt, n_layers=1)
    _, expected = _load_next(builder, static, kv_cache)
    with pytest.raises(GraphCaptureError, match="ExternalEvent no graph-task update recorded"):
        g.replay()                        # on an NPU: waits forever on the task's event
    for task in tasks.tasks[KEY]:         # released without new parameters
        task.event.record()
    g.replay()
    assert not torch.allclose(outs[0].view(len(NEXT), NQ, D), expected, atol=1e-3)


def test_a_padded_batch_replays_right_and_unpadded_lists_break_the_tnd_rule(rt):
    g, tasks, builder, static, kv_cache, outs = _capture_fia(rt, n_layers=1)
    md, expected = _load_next(builder, static, kv_cache, lens=NEXT[:2], padded=3)
    update_before_replay({"layer.0": md}, KEY)
    g.replay()
    torch.testing.assert_close(outs[0].view(3, NQ, D)[:2], expected, atol=1e-5, rtol=1e-5)
    with pytest.raises(FIAArgumentError, match="must equal the packed token count 3"):
        tasks.update(KEY, {"actual_seq_lengths": md.actual_seq_lengths_q,
                           "actual_seq_lengths_kv": md.actual_seq_lengths_kv})


# -- the process-level routing and the warm-up sizes ------------------------------------------

def test_install_routes_the_accelerator_and_event_to_the_stand_in(rt, monkeypatch):
    for name in cpu_npu.ACCELERATOR:
        monkeypatch.setattr(torch.accelerator, name, getattr(torch.accelerator, name))
    monkeypatch.setattr(torch, "Event", torch.Event)
    cpu_npu.install(rt)
    event = torch.Event()
    event.record()
    event.synchronize()                          # a CPU build's torch.Event cannot record
    stats = torch.accelerator.memory_stats(torch.device("cpu"))
    assert stats["allocated_bytes.all.peak"] >= stats["allocated_bytes.all.current"] >= 0
    free, total = torch.accelerator.get_memory_info(torch.device("cpu"))
    assert 0 < free <= total
    big = torch.ones(64 << 20, dtype=torch.uint8)     # 64 MiB, touched
    assert torch.accelerator.max_memory_allocated() >= 32 << 20
    del big


@pytest.mark.parametrize("compile_sizes,capture,ranges,compiled,graphs,expected", [
    ([], [1, 2, 4], [(1, 2048)], True, True, []),        # a captured size lies in the range
    ([], [], [(1, 2048)], True, False, [2048]),           # eager: the range's end
    ([8, 4], [1, 2, 4], [(1, 8), (9, 64)], True, True, [64, 8]),
    ([8], [1], [(1, 64)], False, True, []),               # nothing compiled
])
def test_warmup_sizes(compile_sizes, capture, ranges, compiled, graphs, expected):
    assert warmup_sizes(compile_sizes, capture, ranges, compiled=compiled,
                        graphs=graphs) == expected


def _reads_on_host(t):            # a Python reference that reads its input on the host
    return torch.tensor([float(sum(t.tolist()))])


def python_op_body(x):
    """The body of the test's Python custom op: one NPU operator call."""
    from vllm_ascend_ext.emulation.cpu_npu_graph import as_kernel

    return as_kernel(_reads_on_host)(x * 1)


_LIB = []


def test_an_npu_operator_is_one_kernel_of_the_graph_and_the_capture_leaves_nothing_active(
        rt, monkeypatch):
    """An operator reference (reached through ``ops/_dispatch.pick``) is recorded as one
    kernel: its Python (host reads included, as inside a real kernel) re-runs whole at
    every replay. The recorder re-entered around a Python custom op's body (as for vLLM's
    attention op) leaves no recorder active after the capture (a leak would record every
    later eager operator call into the graph)."""
    from vllm_ascend_ext.emulation import cpu_npu_graph
    from vllm_ascend_ext.emulation.cpu_npu_graph import as_kernel

    if not _LIB:
        lib = torch.library.Library("vllm", "FRAGMENT")
        lib.define("ascend_ext_test_body(Tensor x) -> Tensor")
        lib.impl("ascend_ext_test_body", python_op_body, "CPU")
        _LIB.append(lib)
    monkeypatch.setitem(cpu_npu_graph.PYTHON_OPS, "vllm::ascend_ext_test_body",
                        "tests.ut.emulation.test_cpu_npu:python_op_body")
    x = torch.tensor([1.0, 2.0])
    g = rt.NPUGraph()
    with rt.graph(g):
        y = torch.ops.vllm.ascend_ext_test_body(x)
        z = y * 10
    assert cpu_npu_graph._ACTIVE == [] and as_kernel(_reads_on_host) is _reads_on_host
    assert g.num_calls() == 3                  # mul, the kernel, mul
    x.copy_(torch.tensor([5.0, 6.0]))
    g.replay()
    assert z.tolist() == [110.0]


_WRITE_LIB = []


def test_an_op_that_writes_an_argument_and_returns_a_new_tensor_is_refilled(rt):
    """An operator that updates an argument in place (``Tensor(a!)``) and returns a new
    tensor: the replay must refill that result, not only re-run the in-place part."""
    if not _WRITE_LIB:
        lib = torch.library.Library("ascend_ext_test", "DEF")
        lib.define("count_and_double(Tensor(a!) counter, Tensor x) -> Tensor")

        def impl(counter, x):
            counter.add_(1)
            return x * 2
        lib.impl("count_and_double", impl, "CPU")
        _WRITE_LIB.append(lib)
    counter, x = torch.zeros(1), torch.tensor([1.0, 2.0])
    g = rt.NPUGraph()
    with rt.graph(g):
        y = torch.ops.ascend_ext_test.count_and_double(counter, x) + 0
    x.copy_(torch.tensor([5.0, 7.0]))
    g.replay()
    assert y.tolist() == [10.0, 14.0] and counter.tolist() == [2.0]


def test_seeded_draws_of_a_discarded_partial_prefill_are_undone_exactly():
    """The NPU runner reads offsets before sampling and restores the discarded requests'
    after vLLM's own rewind (worker/seeded_draws.py); the stand-in's generator restores
    the state read at an offset, so the next draw is the one an unchunked request makes."""
    from types import SimpleNamespace

    from vllm_ascend_ext.worker import seeded_draws

    def fresh(seed):
        return torch.Generator().manual_seed(seed)

    generators = {0: fresh(11), 1: fresh(12)}
    requests = {"a": SimpleNamespace(generator=generators[0]), "b": SimpleNamespace(generator=None)}
    cpu_npu.offset_generators(generators, requests, ["a", "b"])
    assert isinstance(generators[0], cpu_npu.OffsetGenerator)
    assert requests["a"].generator is generators[0]
    before = seeded_draws.offsets(generators)                       # the NPU runner's read
    drawn = {i: torch.rand(5, generator=g) for i, g in generators.items()}   # the step's draws
    assert torch.equal(drawn[0], torch.rand(5, generator=fresh(11)))
    gen = generators[0]
    gen.set_offset(gen.get_offset() - 4)                             # vLLM's rewind
    assert seeded_draws.restore(generators, before, [True, False]) == 1
    plain_a, plain_b = fresh(11), fresh(12)
    torch.rand(5, generator=plain_b)                                 # b's sample was kept
    assert torch.equal(torch.rand(5, generator=generators[0]), torch.rand(5, generator=plain_a))
    assert torch.equal(torch.rand(5, generator=generators[1]), torch.rand(5, generator=plain_b))
    with pytest.raises(RuntimeError, match="restores offsets it was read at only"):
        gen.set_offset(3)
    # negative control: an OffsetGenerator never restored keeps drawing further
    kept = cpu_npu.OffsetGenerator(fresh(11))
    torch.rand(5, generator=kept)
    assert not torch.equal(torch.rand(5, generator=kept), torch.rand(5, generator=fresh(11)))


def test_a_kernel_replays_in_the_context_of_its_capture(rt):
    """What the plugin declares around an operator call (here expert parallelism's
    ``groups_may_end_early``: this rank's experts cover 3 of x's 4 rows) belongs to the
    captured kernel: a replay outside that declaration runs as the capture did. Without it
    the reference refuses the groups (checked first, eagerly)."""
    from vllm_ascend_ext.emulation.cpu_npu_graph import as_kernel
    from vllm_ascend_ext.ops.grouped_matmul import grouped_matmul_reference, groups_may_end_early

    x = torch.arange(8.0).view(4, 2)
    w = torch.stack([torch.eye(2), 2 * torch.eye(2)])           # [E=2, K=2, N=2]
    sizes = torch.tensor([1, 2])                                # 3 of 4 rows
    with pytest.raises(ValueError, match="groups ending before the rows"):
        grouped_matmul_reference([x], [w], group_list=sizes, split_item=3, group_type=0,
                                 group_list_type=1)
    g = rt.NPUGraph()
    with rt.graph(g), groups_may_end_early():
        out = as_kernel(grouped_matmul_reference)([x], [w], group_list=sizes, split_item=3,
                                                  group_type=0, group_list_type=1)[0]
    x.copy_(x + 100)
    g.replay()
    assert out[:3].tolist() == [[100.0, 101.0], [204.0, 206.0], [208.0, 210.0]]


def test_vllms_python_ops_in_a_parallel_forward_resolve_to_their_bodies():
    """The Python custom ops vLLM's models call inside a TP / DP forward are captured
    through their bodies (an unknown one would refuse the capture)."""
    from vllm.model_executor.layers.fused_moe.runner import moe_runner
    from vllm.model_executor.models import utils

    from vllm_ascend_ext.emulation.cpu_npu_graph import python_op

    ops = torch.ops.vllm
    assert python_op(ops.sequence_parallel_chunk_impl.default) is utils.sequence_parallel_chunk_impl
    assert python_op(ops.moe_forward.default) is moe_runner._moe_forward


def test_a_process_without_the_stand_in_survives_vllms_non_cpu_clean_up():
    """vLLM's clean-up on a non-CPU platform calls torch.accelerator.empty_cache and
    empty_host_cache; in an emulated engine-core process beside multiprocess workers (no
    stand-in there) a CPU build raises. The emulated platform makes them no-ops there."""
    import subprocess
    import sys

    code = ("import torch\n"
            "try:\n    torch.accelerator.empty_cache()\n    print('no raise')\n"
            "except RuntimeError:\n    print('raises')\n"
            "from vllm_ascend_ext.emulation import cpu_npu\n"
            "print(cpu_npu.quiet_host_accelerator())\n"
            "torch.accelerator.empty_cache(); torch.accelerator.empty_host_cache()\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split("\n")
    assert out[0] == "raises"                                   # the control
    assert out[1] == "['empty_cache', 'empty_host_cache', 'synchronize']" and out[2] == "ok"
