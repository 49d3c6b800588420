"""The start-up policy (platform/startup.py): one order of steps on both platforms, the
model's facts read once per start, vLLM's selector config passed to the backend whole."""

from __future__ import annotations

import collections
import inspect
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from vllm.config import CUDAGraphMode, PassConfig
from vllm.v1.attention.selector import AttentionSelectorConfig

from vllm_ascend_ext.emulation.platform import EmulatedAscendPlatform
from vllm_ascend_ext.errors import AscendExtError
from vllm_ascend_ext.platform import facts, startup
from vllm_ascend_ext.platform.npu import AscendNPUPlatform
from vllm_ascend_ext.platform.soc import from_name

MODELS = Path(__file__).resolve().parents[3] / "vllm_ascend_ext" / "models"

HEAD = ["parse: ascend_ext options", "platform: check", "parse: model facts",
        "parse: quantization description", "refuse: EPLB, all-to-all backends",
        "refuse: features of unanswered platform hooks",
        "refuse: forced MC2 / all-to-all dispatch", "refuse: MC2 HCCL buffer",
        "platform: refuse"]
TAIL = ["default: exact host lists", "default: layer ops", "preflight", "platform: finish"]
# The whole sequence of one start, for a standard decoder, an SFA and a hybrid model.
EXPECTED = {
    "tiny_qwen3": HEAD + ["refuse: drafter speculation", "platform: setup",
                          "default: hybrid prefix caching", "default: graph mode",
                          "default: CUDA fusion passes off"] + TAIL,
    "tiny_dsa": HEAD + ["refuse: SFA block size", "refuse: drafter speculation",
                        "platform: setup", "default: hybrid prefix caching",
                        "default: graph mode", "default: CUDA fusion passes off",
                        "default: SFA block size"] + TAIL,
    "tiny_qwen3_next": HEAD + ["refuse: drafter speculation", "platform: setup",
                               "default: hybrid prefix caching", "default: graph mode",
                               "default: CUDA fusion passes off"] + TAIL,
}
PHASES = ("parse", "refuse", "default", "preflight")


@pytest.fixture
def environ(monkeypatch):
    """The platforms set variables for the engine they start: put back afterwards."""
    saved = dict(os.environ)
    for name in ("VLLM_WORKER_MULTIPROC_METHOD", "VLLM_USE_V2_MODEL_RUNNER",
                 "ASCEND_EXT_NPU_CONTRACT", "ASCEND_EXT_EMULATED_WORKER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ASCEND_EXT_SOC", "ascend910b2")
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "0")
    monkeypatch.setattr(AscendNPUPlatform, "check_stack", classmethod(lambda cls: None))
    yield
    os.environ.clear()
    os.environ.update(saved)


def _vllm_config(model: str, block_size: int | None = None):
    """A real vLLM config as vLLM hands it to the platform hook (the process's own CPU
    platform has already run on it while it was built)."""
    from vllm.config import ModelConfig, VllmConfig

    config = VllmConfig(model_config=ModelConfig(model=str(MODELS / model), dtype=torch.bfloat16,
                                                 skip_tokenizer_init=True))
    config.parallel_config.worker_cls = "auto"
    comp = config.compilation_config
    comp.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
    comp.cudagraph_capture_sizes, comp.max_cudagraph_capture_size = [1, 2, 4], 4
    config.cache_config.user_specified_block_size = block_size is not None
    if block_size is not None:
        config.cache_config.block_size = block_size
    return config


def _start(platform, config, monkeypatch) -> tuple[list[str], collections.Counter]:
    """Run the platform's check_and_update_config; the steps it ran and how often the
    model's facts were computed."""
    trace: list[str] = []
    calls: collections.Counter = collections.Counter()
    run, model_facts, sparse = startup.run, facts.model_facts, facts.is_sparse_mla_model

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    with monkeypatch.context() as m:
        m.setattr(startup, "run", lambda cfg, side: run(cfg, side, on_step=trace.append))
        m.setattr(facts, "model_facts", counted("model_facts", model_facts))
        m.setattr(facts, "is_sparse_mla_model", counted("is_sparse_mla_model", sparse))
        platform.check_and_update_config(config)
    return trace, calls


@pytest.mark.parametrize("model", sorted(EXPECTED))
def test_both_platforms_run_one_sequence_and_read_the_model_once(model, environ, monkeypatch):
    npu_trace, npu_calls = _start(AscendNPUPlatform, _vllm_config(model), monkeypatch)
    emu_trace, emu_calls = _start(EmulatedAscendPlatform, _vllm_config(model), monkeypatch)
    assert npu_trace == emu_trace == EXPECTED[model]
    once = collections.Counter(model_facts=1, is_sparse_mla_model=1)
    assert npu_calls == once and emu_calls == once


def test_the_shared_steps_follow_parse_refusals_defaults_preflight():
    for trace in EXPECTED.values():
        shared = [name.split(":")[0] for name in trace if not name.startswith("platform")]
        assert shared == sorted(shared, key=PHASES.index), shared
        # the platform's own steps sit at their places between the phases
        assert trace.index("platform: check") < trace.index("parse: model facts")
        last_refusal = max(i for i, n in enumerate(trace) if n.startswith("refuse"))
        assert last_refusal < trace.index("platform: setup") < trace.index("default: graph mode")
        assert trace[-1] == "platform: finish"


def test_an_sfa_block_size_is_refused_alike_on_both_platforms(environ, monkeypatch):
    # The emulated platform reads the user's block size before vLLM's CPU platform
    # replaces an MLA model's with 16 (it served 24 as 16 before).
    for platform in (AscendNPUPlatform, EmulatedAscendPlatform):
        with pytest.raises(AscendExtError, match="block_size=24 is not a multiple of 16"):
            platform.check_and_update_config(_vllm_config("tiny_dsa", block_size=24))


def test_an_sfa_model_keeps_what_vllms_cpu_platform_turns_off_for_its_mla_kernel(
        environ, monkeypatch):
    config = _vllm_config("tiny_dsa")
    config.scheduler_config.enable_chunked_prefill = True
    config.cache_config.enable_prefix_caching = True
    EmulatedAscendPlatform.check_and_update_config(config)
    assert config.scheduler_config.enable_chunked_prefill
    assert config.cache_config.enable_prefix_caching
    assert config.cache_config.block_size == 128
    assert config.compilation_config.cudagraph_mode == CUDAGraphMode.NONE  # SFA: eager


def test_emulated_decode_graphs_keep_vllms_capture_sizes_and_compile_eager(environ, monkeypatch):
    config = _vllm_config("tiny_qwen3")
    EmulatedAscendPlatform.check_and_update_config(config)
    comp = config.compilation_config
    assert comp.cudagraph_mode == CUDAGraphMode.FULL_DECODE_ONLY
    assert comp.cudagraph_capture_sizes == [1, 2, 4]
    # the NPU platform's compile backend (vLLM asks the platform when none is configured)
    assert EmulatedAscendPlatform.get_compile_backend() == "eager"


# Engine-free: the policy with a platform side that records, on a config without a model.

def _bare_config(**parallel):
    parallel = {"enable_expert_parallel": False, "enable_eplb": False,
                "data_parallel_size": 1, "tensor_parallel_size": 1,
                "pipeline_parallel_size": 1, **parallel}
    return SimpleNamespace(
        additional_config=None, model_config=None, speculative_config=None,
        parallel_config=SimpleNamespace(**parallel),
        scheduler_config=SimpleNamespace(async_scheduling=True),
        cache_config=SimpleNamespace(user_specified_block_size=False, block_size=16),
        compilation_config=SimpleNamespace(cudagraph_mode=CUDAGraphMode.FULL,
                                           cudagraph_capture_sizes=[1],
                                           max_cudagraph_capture_size=1, custom_ops=["all"],
                                           pass_config=PassConfig()))


def _recording_side(log: list[str], npu_engine: bool = True) -> startup.Side:
    def hook(name):
        return lambda start: log.append(f"side {name}")

    def check(vllm_config):
        log.append("side check")
        return from_name("ascend910b2"), npu_engine

    return startup.Side("t", check=check, refuse=hook("refuse"), setup=hook("setup"),
                        finish=hook("finish"))


def test_the_policy_calls_the_platform_at_its_places_without_an_engine():
    log: list[str] = []
    config = _bare_config()
    start = startup.run(config, _recording_side(log), on_step=log.append)
    assert [n for n in log if n.startswith("side")] == [
        "side check", "side refuse", "side setup", "side finish"]
    assert log.index("side refuse") == log.index("platform: refuse") + 1
    assert log.index("side setup") == log.index("platform: setup") + 1
    assert start.facts == facts.NO_MODEL and start.npu_engine
    assert config.compilation_config.cudagraph_mode == CUDAGraphMode.FULL_DECODE_ONLY


def test_a_refused_config_gets_no_platform_setup():
    log: list[str] = []
    with pytest.raises(AscendExtError, match="--enable-eplb"):
        startup.run(_bare_config(enable_eplb=True), _recording_side(log))
    assert log == ["side check"]


def test_the_cpu_worker_path_skips_the_npu_engines_steps():
    log: list[str] = []
    config = _bare_config()
    startup.run(config, _recording_side(log, npu_engine=False), on_step=log.append)
    assert "default: graph mode" not in log and "refuse: drafter speculation" not in log
    assert config.compilation_config.cudagraph_mode == CUDAGraphMode.FULL  # untouched


def test_model_facts():
    assert facts.model_facts(None) == facts.NO_MODEL
    text = SimpleNamespace(index_topk=8)
    mc = SimpleNamespace(use_mla=True, hf_config=text, hf_text_config=text,
                         is_attention_free=False, is_hybrid=False, get_head_size=lambda: 576)
    got = facts.model_facts(mc)
    assert got == facts.ModelFacts(present=True, use_mla=True, sparse_mla=True, head_size=576)
    with pytest.raises(AttributeError):
        got.hybrid = True  # frozen: one value for the whole start
    free = SimpleNamespace(use_mla=False, is_attention_free=True, is_hybrid=True)
    assert facts.model_facts(free) == facts.ModelFacts(present=True, attention_free=True,
                                                       hybrid=True)


# vLLM's selector config reaches the backend whole.

def _recorded_validation(monkeypatch, selector_config) -> dict:
    from vllm_ascend_ext.attention.fia.backend import AscendFIABackend
    from vllm_ascend_ext.platform.selection import FIA_BACKEND_PATH, select_attention_backend

    seen: dict = {}

    def validate(cls, **kwargs):
        seen.update(kwargs)
        return []

    monkeypatch.setattr(AscendFIABackend, "validate_configuration", classmethod(validate))
    assert select_attention_backend("t", from_name("a2"), selector_config,
                                    log=False) == FIA_BACKEND_PATH
    return seen


def _selector(cls=AttentionSelectorConfig, **extra):
    base = AttentionSelectorConfig(head_size=64, dtype=torch.bfloat16, kv_cache_dtype="auto",
                                   block_size=128)
    return cls(**base._asdict(), **extra)


def test_a_field_vllm_adds_to_the_selector_config_reaches_the_backend(monkeypatch):
    Future = collections.namedtuple("Future", AttentionSelectorConfig._fields + ("use_new",))
    seen = _recorded_validation(monkeypatch, _selector(Future, use_new=True))
    assert seen["use_new"] is True
    assert set(seen) == set(Future._fields) | {"device_capability"}
    # negative control: vLLM's own selector config carries no such field
    seen = _recorded_validation(monkeypatch, _selector())
    assert "use_new" not in seen and set(seen) == set(AttentionSelectorConfig._fields) | {
        "device_capability"}


def test_the_backends_validation_takes_exactly_the_selector_configs_fields():
    # What makes passing the config whole sound: vLLM keeps the two in step (its CUDA
    # platform passes **attn_selector_config._asdict() the same way).
    from vllm_ascend_ext.attention.fia.backend import AscendFIABackend
    from vllm_ascend_ext.attention.sfa.backend import AscendSFABackend

    for backend in (AscendFIABackend, AscendSFABackend):
        params = set(inspect.signature(backend.validate_configuration).parameters)
        assert params == set(AttentionSelectorConfig._fields) | {"device_capability"}


def _hybrid_config(prefix_caching: bool):
    from vllm.config import CacheConfig, ModelConfig, VllmConfig

    return VllmConfig(model_config=ModelConfig(model=str(MODELS / "tiny_qwen3_next"),
                                               dtype=torch.bfloat16, skip_tokenizer_init=True),
                      cache_config=CacheConfig(enable_prefix_caching=prefix_caching))


def test_a_hybrid_model_keeps_vllms_align_mode_on_both_platforms(environ, monkeypatch):
    for platform in (AscendNPUPlatform, EmulatedAscendPlatform):
        config = _hybrid_config(True)
        config.parallel_config.worker_cls = "auto"
        platform.check_and_update_config(config)
        cache = config.cache_config
        assert (cache.enable_prefix_caching, cache.mamba_cache_mode) == (True, "align")


def test_a_hybrid_model_with_a_kv_connector_turns_prefix_caching_off(environ):
    from vllm.config import KVTransferConfig

    from vllm_ascend_ext.platform.config_hooks import hybrid_prefix_caching_off

    plain = _hybrid_config(True)
    assert hybrid_prefix_caching_off(plain) is None
    assert plain.cache_config.mamba_cache_mode == "align"
    config = _hybrid_config(True)
    config.kv_transfer_config = KVTransferConfig(kv_connector="ExampleConnector",
                                                 kv_role="kv_both")
    why = hybrid_prefix_caching_off(config)
    assert "KV connector" in why and "Gated-DeltaNet" in why
    cache = config.cache_config
    assert (cache.enable_prefix_caching, cache.mamba_cache_mode) == (False, "none")
    assert cache.mamba_block_size == config.model_config.max_model_len
    assert hybrid_prefix_caching_off(_hybrid_config(False)) is None


# -- the block size vLLM's platform step leaves on the NPU platform ------------------------
# vLLM's ``Platform.update_block_size_for_backend`` (run by the executor after start-up)
# replaces a block size the user did not pass with the backend's preferred one, then aligns
# a hybrid model's to its mamba page. The emulated platform (vLLM's CPU platform) skips the
# first phase; the NPU platform runs both, so the backends prefer paged prefill's 128.

QWEN3_NEXT_80B = {"hidden_size": 2048, "num_attention_heads": 16, "num_key_value_heads": 2,
                  "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
                  "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                  "linear_conv_kernel_dim": 4}


def _vllm_block_step(config, backend, monkeypatch) -> int:
    """vLLM's own block-size step on the NPU platform, the model's attention layers
    reporting ``backend`` (a backend or the list of them, what they report once built)."""
    backends = backend if isinstance(backend, list) else [backend]
    monkeypatch.setattr(AscendNPUPlatform, "_find_non_ssm_backends",
                        classmethod(lambda cls, cfg: backends))
    AscendNPUPlatform.update_block_size_for_backend(config)
    return config.cache_config.block_size


@pytest.mark.parametrize("model,user,expected", [("tiny_qwen3", None, 128),
                                                 ("tiny_qwen3", 256, 256),
                                                 ("tiny_dsa", None, 128),
                                                 ("tiny_dsa", 64, 64)])
def test_vllms_block_size_step_keeps_the_npu_platforms_size(model, user, expected, environ,
                                                           monkeypatch):
    from vllm.platforms.interface import Platform

    from vllm_ascend_ext.attention.fia.backend import AscendFIABackend
    from vllm_ascend_ext.attention.sfa.backend import AscendSFABackend, AscendSFACacheBackend

    config = _vllm_config(model, block_size=user)
    AscendNPUPlatform.check_and_update_config(config)
    # an SFA model's layers report two backends: SFA's and its companion caches'
    backend = [AscendSFABackend, AscendSFACacheBackend] if model == "tiny_dsa" \
        else AscendFIABackend
    assert _vllm_block_step(config, backend, monkeypatch) == expected
    if model == "tiny_dsa" and user is None:   # the control: vLLM's rule for several
        assert Platform._preferred_block_size_for_backends.__func__(
            AscendNPUPlatform, backend, 16, config) == 16


def test_a_hybrid_models_aligned_block_is_a_multiple_of_128(environ, monkeypatch, tmp_path):
    """Qwen3-Next-80B's sizes at TP 4: vLLM aligns the attention page to the GDN state's
    page; from the backend's 128 that stays a multiple of 128 (paged prefill's rule); from
    16-multiples and vLLM's default preference of 16 it is not (272 with a bf16 state, 528
    with the float32 state vLLM's CPU platform sets in this process)."""
    import json

    from vllm.config import ModelConfig, ParallelConfig, VllmConfig
    from vllm.v1.attention.backend import AttentionBackend

    from vllm_ascend_ext.attention.fia.backend import AscendFIABackend

    source = MODELS / "tiny_qwen3_next"
    config_json = {**json.loads((source / "config.json").read_text()), **QWEN3_NEXT_80B}
    (tmp_path / "config.json").write_text(json.dumps(config_json))

    def aligned(prefer_vllms_default: bool) -> int:
        config = VllmConfig(
            model_config=ModelConfig(model=str(tmp_path), dtype=torch.bfloat16,
                                     skip_tokenizer_init=True),
            parallel_config=ParallelConfig(tensor_parallel_size=4))
        AscendNPUPlatform.check_and_update_config(config)
        with monkeypatch.context() as m:
            if prefer_vllms_default:  # the control: the earlier declaration (16-multiples)
                m.setattr(AscendFIABackend, "get_preferred_block_size",
                          classmethod(AttentionBackend.get_preferred_block_size.__func__))
                m.setattr(AscendFIABackend, "get_supported_kernel_block_sizes",
                          staticmethod(lambda spec=None: list(range(16, 513, 16))))
            return _vllm_block_step(config, AscendFIABackend, m)

    block, before = aligned(False), aligned(True)
    assert block % 128 == 0 and 128 <= block
    assert before % 128 and before < block + 128, before
    # the aligned size is one the backend serves through its kernel blocks
    assert any(block % size == 0 for size in AscendFIABackend.get_supported_kernel_block_sizes())


def test_an_emulated_multi_rank_engine_starts_on_one_numa_node(environ, monkeypatch):
    """vLLM's executor binds a CPU platform's workers one NUMA node each and asserts with
    fewer nodes than ranks; the emulated NPU platform is not a CPU platform (vLLM binds
    none of its workers, as on an NPU), so a TP engine starts on a one-node machine
    without a hand-set variable."""
    import vllm.utils.cpu_resource_utils as cr_utils
    import vllm.utils.ompmultiprocessing as omp
    from vllm.config import ModelConfig, ParallelConfig, VllmConfig
    from vllm.platforms.cpu import CpuPlatform

    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr(cr_utils, "get_visible_memory_node", lambda: [0])   # one node
    config = VllmConfig(model_config=ModelConfig(model=str(MODELS / "tiny_qwen3"),
                                                 dtype=torch.float32, skip_tokenizer_init=True),
                        parallel_config=ParallelConfig(tensor_parallel_size=2))
    EmulatedAscendPlatform.check_and_update_config(config)
    assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ
    monkeypatch.setattr(omp, "current_platform", EmulatedAscendPlatform())
    omp.OMPProcessManager(config)                  # the executor's step: no assertion
    monkeypatch.setattr(omp, "current_platform", CpuPlatform())
    with pytest.raises(AssertionError, match="Not enough allowed NUMA nodes"):
        omp.OMPProcessManager(config)              # the control: a CPU platform's binding


def test_vllms_cuda_fusion_passes_are_off_on_the_npu_platform(environ, monkeypatch):
    """vLLM imports its fusion passes only on CUDA/ROCm/XPU, and its optimization level
    turns ``fuse_norm_quant`` on with the rms_norm custom op (the plugin's layer ops):
    its pass manager then fails at the first compile. The NPU platform turns them off."""
    from vllm.compilation.passes.pass_manager import PostGradPassManager

    config = _vllm_config("tiny_qwen3")
    pass_config = config.compilation_config.pass_config
    pass_config.fuse_norm_quant = True      # what the level's rule gives with +rms_norm
    with pytest.raises(NameError, match="FusionPass"):   # the control: vLLM as it stands
        PostGradPassManager().configure(config)
    AscendNPUPlatform.check_and_update_config(config)
    assert not any(getattr(pass_config, name) for name in type(pass_config).__dataclass_fields__
                   if name.startswith("fuse_") or name.endswith("_fusion"))
    assert pass_config.eliminate_noops      # vLLM's device-neutral passes stay
    PostGradPassManager().configure(config)
