"""The NPU worker and model runner, built on a CPU with a stand-in device module.

The classes are the plugin's own (vLLM's GPU worker and V1 runner underneath); only the
device module is a stand-in with torch.npu's names, which counts what vLLM's inherited
code creates through the routed ``torch.cuda`` names.
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from vllm.config import ModelConfig, ParallelConfig, VllmConfig, set_current_vllm_config

from vllm_ascend_ext.errors import AscendExtError
from vllm_ascend_ext.worker import npu_device
from vllm_ascend_ext.worker.npu_model_runner import AscendNPUModelRunner
from vllm_ascend_ext.worker.npu_worker import AscendNPUWorker, dp_adjusted_local_rank

TINY = Path(__file__).resolve().parents[3] / "vllm_ascend_ext" / "models" / "tiny_qwen3"


class StandInDevice:
    """torch.npu's stream/event/graph names; counts what is created through them."""

    def __init__(self):
        self.created = {"Stream": 0, "Event": 0}
        device = self

        class Stream:
            def __init__(self, device_=None, priority=0, **kwargs):
                device.created["Stream"] += 1

            def wait_stream(self, other):
                pass

            def synchronize(self):
                pass

        class Event:
            # torch.npu.Event's keywords, without CUDA's ``blocking``
            def __init__(self, enable_timing=False, interprocess=False):
                device.created["Event"] += 1

            def record(self, stream=None):
                pass

            def synchronize(self):
                pass

        self.Stream, self.Event, self.NPUGraph = Stream, Event, type("NPUGraph", (), {})
        self.current = None
        self.current_stream = lambda device=None: self.current or Stream()
        self.default_stream = lambda device=None: Stream()
        self.stream = lambda s: contextlib.nullcontext()
        self.set_stream = lambda s: setattr(self, "current", s)
        self.graph = lambda *args, **kwargs: contextlib.nullcontext()
        self.graph_pool_handle = lambda: None
        self.is_current_stream_capturing = lambda: False


@pytest.fixture
def routed(monkeypatch):
    """The real torch.cuda names routed to a stand-in, restored after the test."""
    from vllm.utils import torch_utils

    for name in npu_device.CUDA_ROUTED:
        monkeypatch.setattr(torch.cuda, name, getattr(torch.cuda, name))
    # vLLM's current-stream record, which routed stream switches update
    monkeypatch.setattr(torch_utils._current_stream_tls, "value", None, raising=False)
    dev = StandInDevice()
    replaced = npu_device.route_cuda_streams(dev)
    return dev, replaced


def _config(**parallel):
    return VllmConfig(model_config=ModelConfig(model=str(TINY), dtype=torch.float32,
                                               skip_tokenizer_init=True),
                      parallel_config=ParallelConfig(**parallel))


def _worker(config):
    return AscendNPUWorker(config, local_rank=0, rank=0,
                           distributed_init_method="tcp://127.0.0.1:29555",
                           is_driver_worker=True)


def test_routing_points_each_cuda_name_at_the_device_module(routed):
    dev, replaced = routed
    assert set(replaced) == set(npu_device.CUDA_ROUTED)
    assert torch.cuda.Stream is dev.Stream and torch.cuda.CUDAGraph is dev.NPUGraph
    assert isinstance(torch.cuda.current_stream, functools.partial)
    assert torch.cuda.current_stream.func is dev.current_stream
    torch.cuda.Event(blocking=True)            # CUDA's keyword, which the device lacks
    assert dev.created["Event"] == 1
    npu_device.route_cuda_streams(dev)         # idempotent
    assert torch.cuda.Stream is dev.Stream


def test_routed_stream_switches_keep_vllms_current_stream(routed):
    """vLLM captures graphs on ``vllm.utils.torch_utils.current_stream()``, a record its
    own ``torch.cuda.set_stream`` wrapper keeps; the routed names keep it too."""
    from vllm.utils import torch_utils

    dev, _ = routed
    capture, other = dev.Stream(), dev.Stream()
    torch.cuda.set_stream(capture)
    assert torch_utils.current_stream() is capture
    with torch.cuda.stream(other):
        assert torch_utils.current_stream() is other
    assert torch_utils.current_stream() is not other


def test_worker_builds_the_plugins_v1_runner_with_the_devices_streams(routed):
    dev, _ = routed
    config = _config()
    config.scheduler_config.async_scheduling = True   # as on the NPU platform
    worker = _worker(config)
    assert worker.use_v2_model_runner is False
    worker.device = torch.device("cpu")
    before = dict(dev.created)
    with set_current_vllm_config(config):
        runner = worker._make_model_runner()
    assert type(runner) is AscendNPUModelRunner
    # vLLM's runner made its async-output stream and event through the routed names:
    # the device's, not CUDA's.
    assert isinstance(runner.async_output_copy_stream, dev.Stream)
    assert dev.created["Stream"] > before["Stream"] and dev.created["Event"] > before["Event"]


def test_worker_refuses_sleep_and_cuda_profilers(routed):
    config = _config()
    worker = _worker(config)
    with pytest.raises(AscendExtError, match="sleep mode is not available"):
        worker.sleep(1)
    with pytest.raises(AscendExtError, match="sleep mode is not available"):
        worker.wake_up()
    worker.profiler_config = SimpleNamespace(profiler="cuda")
    with pytest.raises(AscendExtError, match="profiler=cuda profiles CUDA"):
        worker.profile(True)


@pytest.mark.parametrize("backend,dp_local,dp_index,nnodes,local,shard,expected", [
    ("mp", 0, 0, 1, 1, None, 1),          # single replica: unchanged
    ("mp", 1, 1, 1, 1, None, 1 + 4),      # second replica: after the first's 4 devices
    ("mp", None, 2, 1, 0, None, 8),       # no local rank: the DP index
    ("ray", 1, 1, 1, 1, None, 1),         # Ray places workers itself
    ("mp", 1, 1, 2, 1, None, 1),          # multi-node DP: local ranks already per node
    ("mp", 1, 1, 1, 1, [4, 5, 6, 7], 1),  # vLLM gave the replica its shard: index in it
])
def test_data_parallel_replicas_take_their_own_devices(backend, dp_local, dp_index, nnodes,
                                                       local, shard, expected):
    parallel = SimpleNamespace(
        distributed_executor_backend=backend, data_parallel_backend="mp",
        nnodes_within_dp=nnodes, data_parallel_rank_local=dp_local,
        data_parallel_index=dp_index, pipeline_parallel_size=1,
        prefill_context_parallel_size=1, tensor_parallel_size=4,
        assigned_physical_gpu_ids=shard)
    assert dp_adjusted_local_rank(parallel, local) == expected
