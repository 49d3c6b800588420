"""The NPU platform's flags and its graph-mode decision (no NPU needed)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from vllm.compilation.cuda_graph import CUDAGraphWrapper
from vllm.config import CUDAGraphMode
from vllm.utils.import_utils import resolve_obj_by_qualname

from vllm_ascend_ext.errors import AscendExtError
from vllm_ascend_ext.platform import npu
from vllm_ascend_ext.platform.graph_mode import apply_graph_mode, decide_graph_mode
from vllm_ascend_ext.platform.npu import (
    AscendNPUPlatform,
    refuse_unsupported_parallelism,
    use_v1_runner,
)
from vllm_ascend_ext.worker.npu_graph import AscendNPUGraphWrapper
from vllm_ascend_ext.worker.npu_worker import AscendNPUWorker


def test_platform_flags_tell_vllm_the_truth():
    p = AscendNPUPlatform()
    assert p.opaque_attention_op() is True
    assert p.support_static_graph_mode() is True
    wrapper = resolve_obj_by_qualname(p.get_static_graph_wrapper_cls())
    assert issubclass(wrapper, CUDAGraphWrapper) and wrapper is AscendNPUGraphWrapper
    assert p.is_sleep_mode_available() is False
    assert p.support_hybrid_kv_cache() is True   # GDN models: vLLM's hybrid KV manager
    assert p.supported_dtypes == [torch.bfloat16, torch.float16]
    assert p.dist_backend == "hccl" and p.device_type == "npu"
    assert p.worker_cls_path() == "vllm_ascend_ext.worker.npu_worker.AscendNPUWorker"
    assert resolve_obj_by_qualname(p.worker_cls_path()) is AscendNPUWorker
    assert p.check_runner_kv_caches_multi_layer() is None


def test_fp32_is_refused_naming_the_fix():
    AscendNPUPlatform.check_if_supports_dtype(torch.bfloat16)
    AscendNPUPlatform.check_if_supports_dtype(torch.float16)
    with pytest.raises(AscendExtError, match="--dtype float32.*--dtype bfloat16"):
        AscendNPUPlatform.check_if_supports_dtype(torch.float32)


@pytest.mark.parametrize("requested,eager,sparse,mode,needle", [
    (CUDAGraphMode.FULL_AND_PIECEWISE, False, False, CUDAGraphMode.FULL_DECODE_ONLY,
     "FULL_AND_PIECEWISE is not offered"),
    (CUDAGraphMode.FULL_DECODE_ONLY, False, False, CUDAGraphMode.FULL_DECODE_ONLY,
     "updated per replay"),
    (CUDAGraphMode.FULL, False, False, CUDAGraphMode.FULL_DECODE_ONLY, "FULL is not offered"),
    # vLLM's own downgrade (pooling models, KV connectors) is never undone into FULL
    (CUDAGraphMode.PIECEWISE, False, False, CUDAGraphMode.NONE, "vLLM chose piecewise"),
    (CUDAGraphMode.FULL_AND_PIECEWISE, True, False, CUDAGraphMode.NONE, "--enforce-eager"),
    (CUDAGraphMode.NONE, False, False, CUDAGraphMode.NONE, "cudagraph_mode NONE"),
    (CUDAGraphMode.FULL_AND_PIECEWISE, False, True, CUDAGraphMode.NONE, "SFA backend"),
])
def test_graph_mode_decision(requested, eager, sparse, mode, needle):
    got, why = decide_graph_mode(requested, enforce_eager=eager, sparse=sparse)
    assert got == mode and needle in why


@pytest.mark.parametrize("sizes", [dict(tensor_parallel_size=2), dict(data_parallel_size=2),
                                   dict(tensor_parallel_size=2, data_parallel_size=2)],
                         ids=["tp2", "dp2", "dp2xtp2"])
def test_tensor_and_data_parallel_runs_keep_decode_graphs(sizes):
    """The plugin's communicator passes vLLM's graph-capture context (its collectives are
    captured like any kernel), so TP and DP keep decode graphs."""
    config = _config(CUDAGraphMode.FULL_AND_PIECEWISE, **sizes)
    got, _ = apply_graph_mode(config, sparse=False)
    assert got == config.compilation_config.cudagraph_mode == CUDAGraphMode.FULL_DECODE_ONLY


def test_pipeline_parallel_runs_are_eager():
    got, why = decide_graph_mode(CUDAGraphMode.FULL_AND_PIECEWISE, enforce_eager=False,
                                 sparse=False, pipeline_stages=2)
    assert got == CUDAGraphMode.NONE and "pipeline stages" in why
    config = _config(CUDAGraphMode.FULL_AND_PIECEWISE, pipeline_parallel_size=2)
    apply_graph_mode(config, sparse=False)
    assert config.compilation_config.cudagraph_mode == CUDAGraphMode.NONE
    assert config.compilation_config.cudagraph_capture_sizes == []


def test_the_emulated_platform_is_the_npu_platform_on_a_cpu_device(monkeypatch):
    """Emulation instantiates the NPU platform (an OOT platform, not vLLM's CPU one), so
    vLLM's per-platform branches take the NPU's side: e.g. its MoE runner calls the opaque
    ``moe_forward`` op (the DP/EP token exchange inside it, untraced) where a CPU platform
    would call the layer inside the compiled model."""
    from vllm.model_executor.layers.fused_moe.runner import moe_runner
    from vllm.platforms.cpu import CpuPlatform
    from vllm.platforms.interface import PlatformEnum

    from vllm_ascend_ext.emulation.platform import EmulatedAscendPlatform

    emu = EmulatedAscendPlatform()
    assert isinstance(emu, AscendNPUPlatform) and not isinstance(emu, CpuPlatform)
    assert emu._enum == PlatformEnum.OOT and not emu.is_cpu() and emu.is_out_of_tree()
    # what the device requires, and nothing else
    assert (emu.device_type, emu.dispatch_key, emu.dist_backend) == ("cpu", "CPU", "gloo")
    assert emu.get_compile_backend() == AscendNPUPlatform.get_compile_backend() == "eager"
    assert emu.support_hybrid_kv_cache() and emu.opaque_attention_op()
    runner = SimpleNamespace(_shared_experts=None)
    monkeypatch.setattr(moe_runner, "current_platform", emu)
    assert moe_runner.MoERunner._select_forward(runner) is torch.ops.vllm.moe_forward
    monkeypatch.setattr(moe_runner, "current_platform", CpuPlatform())   # the control
    assert moe_runner.MoERunner._select_forward(runner) is not torch.ops.vllm.moe_forward


def test_the_engine_runs_the_v1_runner_and_refuses_a_forced_v2(monkeypatch):
    monkeypatch.delenv(npu.V2_ENV, raising=False)
    config = SimpleNamespace(use_v2_model_runner=False)
    use_v1_runner(config)
    import os

    assert os.environ[npu.V2_ENV] == "0"
    monkeypatch.setenv(npu.V2_ENV, "1")
    with pytest.raises(AscendExtError, match="VLLM_USE_V2_MODEL_RUNNER=1"):
        use_v1_runner(config)
    monkeypatch.setenv(npu.V2_ENV, "0")
    with pytest.raises(AscendExtError, match="HiSparse"):
        use_v1_runner(SimpleNamespace(use_v2_model_runner=True))


def _config(mode, eager=False, **parallel):
    parallel.setdefault("tensor_parallel_size", 1)
    parallel.setdefault("pipeline_parallel_size", 1)
    parallel.setdefault("data_parallel_size", 1)
    return SimpleNamespace(
        compilation_config=SimpleNamespace(cudagraph_mode=mode, cudagraph_capture_sizes=[1, 2],
                                           max_cudagraph_capture_size=2),
        model_config=SimpleNamespace(enforce_eager=eager),
        parallel_config=SimpleNamespace(**parallel))


def test_apply_graph_mode_sets_the_mode_and_clears_sizes_when_eager():
    dense = _config(CUDAGraphMode.FULL_AND_PIECEWISE)
    apply_graph_mode(dense, sparse=False)
    assert dense.compilation_config.cudagraph_mode == CUDAGraphMode.FULL_DECODE_ONLY
    assert dense.compilation_config.cudagraph_capture_sizes == [1, 2]
    sparse = _config(CUDAGraphMode.FULL_AND_PIECEWISE)
    apply_graph_mode(sparse, sparse=True)
    assert sparse.compilation_config.cudagraph_mode == CUDAGraphMode.NONE
    assert sparse.compilation_config.cudagraph_capture_sizes == []


def test_dual_batch_overlap_is_refused():
    refuse_unsupported_parallelism(_config(CUDAGraphMode.NONE, enable_dbo=False))
    with pytest.raises(AscendExtError, match="--enable-dbo"):
        refuse_unsupported_parallelism(_config(CUDAGraphMode.NONE, enable_dbo=True))


def test_workers_are_spawned_unless_the_user_chose(monkeypatch):
    monkeypatch.delenv(npu.SPAWN_ENV, raising=False)
    npu.use_spawn()
    import os

    assert os.environ[npu.SPAWN_ENV] == "spawn"
    monkeypatch.setenv(npu.SPAWN_ENV, "fork")
    npu.use_spawn()
    assert os.environ[npu.SPAWN_ENV] == "fork"


def test_check_and_update_config_on_a_real_config(monkeypatch):
    from pathlib import Path

    from vllm.config import ModelConfig, VllmConfig

    tiny = Path(__file__).resolve().parents[3] / "vllm_ascend_ext" / "models" / "tiny_qwen3"
    config = VllmConfig(model_config=ModelConfig(model=str(tiny), dtype=torch.bfloat16,
                                                 skip_tokenizer_init=True))
    # What vLLM hands the platform hook before any platform has touched it.
    config.parallel_config.worker_cls = "auto"
    config.compilation_config.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
    config.cache_config.user_specified_block_size = False
    monkeypatch.setenv("ASCEND_EXT_SOC", "ascend910b2")
    monkeypatch.delenv(npu.SPAWN_ENV, raising=False)
    monkeypatch.setattr(AscendNPUPlatform, "check_stack", classmethod(lambda cls: None))
    monkeypatch.delenv(npu.V2_ENV, raising=False)
    AscendNPUPlatform.check_and_update_config(config)
    assert config.use_v2_model_runner is False
    assert config.parallel_config.worker_cls == npu.WORKER_CLS
    assert config.compilation_config.cudagraph_mode == CUDAGraphMode.FULL_DECODE_ONLY
    assert config.cache_config.block_size == 128
    import os

    assert os.environ[npu.SPAWN_ENV] == "spawn"
