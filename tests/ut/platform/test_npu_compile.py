"""On the NPU platform class, a compiled model never bakes FIA's per-step host lists.

vLLM's ``Attention`` calls the backend directly inside the compiled graph unless the
platform declares attention opaque, and vLLM compiles ``fullgraph=True``. This builds a
real ``Attention`` layer with the NPU platform as vLLM's current platform (its backend
selection, its ``opaque_attention_op``), compiles a module around it with Dynamo, and
runs two decode steps whose sequence lengths differ on the one compiled graph:

* the graph holds one opaque ``vllm.unified_attention_with_output`` call and none of
  the steps' lengths; no recompilation happens between the steps;
* each step's output is dense attention over that step's lengths.

Negative control: the same layer with the direct call (what a non-opaque platform
gets) cannot be compiled into one graph that serves both steps.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
import vllm.platforms
from vllm.config import CompilationConfig, ModelConfig, VllmConfig, set_current_vllm_config
from vllm.forward_context import set_forward_context
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.kv_cache_interface import FullAttentionSpec

import vllm_ascend_ext
from tests.ut.dense import dense_attention
from vllm_ascend_ext.attention.fia.builder import AscendFIAMetadataBuilder
from vllm_ascend_ext.platform.npu import AscendNPUPlatform

NQ, NKV, D, BS, NB = 4, 2, 64, 16, 12
STEPS = ([5, 9, 3], [17, 2, 30])   # kv lengths of two decode steps (q len 1 each)
LAYER = "model.layers.0.self_attn.attn"


@pytest.fixture
def npu_platform(monkeypatch):
    """A CPU-device config; then the NPU platform class as vLLM's current platform."""
    config = VllmConfig(model_config=ModelConfig(
        model=str(Path(__file__).resolve().parents[3] / "vllm_ascend_ext" / "models"
                  / "tiny_qwen3"), dtype=torch.float32, skip_tokenizer_init=True),
        compilation_config=CompilationConfig())
    # vLLM registers its attention ops for the current platform's dispatch key at
    # import: import under the CPU platform, where this test's tensors live (on an NPU
    # host they register for PrivateUse1).
    importlib.import_module("vllm.model_executor.layers.attention")

    monkeypatch.setenv("ASCEND_EXT_EMULATE", "1")  # the plugin is active in this process
    vllm_ascend_ext.register()   # vLLM's general-plugin hook: the backends' names
    monkeypatch.setenv("ASCEND_EXT_SOC", "ascend910b2")
    monkeypatch.setattr(vllm.platforms, "_current_platform", AscendNPUPlatform())
    yield config


def _attention_layer(config):
    from vllm.model_executor.layers.attention import Attention

    with set_current_vllm_config(config):
        attn = Attention(NQ, D, D**-0.5, num_kv_heads=NKV, prefix=LAYER)
    return config, attn


class OneLayer(torch.nn.Module):
    def __init__(self, attn):
        super().__init__()
        self.attn = attn

    def forward(self, q, k, v):
        return self.attn(q, k, v) * 1.0


def _metadata(kv_lens):
    n = len(kv_lens)
    qsl = torch.arange(n + 1, dtype=torch.int32)
    table = torch.arange(NB, dtype=torch.int32).view(n, NB // n)
    slots = [int(table[b, (L - 1) // BS]) * BS + (L - 1) % BS for b, L in enumerate(kv_lens)]
    cam = CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl,
        seq_lens=torch.tensor(kv_lens, dtype=torch.int32), num_reqs=n, num_actual_tokens=n,
        max_query_len=1, max_seq_len=max(kv_lens), block_table_tensor=table,
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        seq_lens_cpu_upper_bound=torch.tensor(kv_lens, dtype=torch.int32))
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=NKV, head_size=D, dtype=torch.float32)
    return AscendFIAMetadataBuilder(spec, [LAYER], None, torch.device("cpu"),
                                    mode="off").build(0, cam)


def _step(config, fn, kv_lens, seed):
    g = torch.Generator().manual_seed(seed)
    n, longest = len(kv_lens), max(max(s) for s in STEPS)
    seq_k = [torch.randn(longest, NKV, D, generator=g) for _ in range(n)]
    seq_v = [torch.randn(longest, NKV, D, generator=g) for _ in range(n)]
    cache = torch.zeros(NB, NKV, BS, 2 * D)
    planes = cache.view(NB, 2, BS, NKV, D)
    table = torch.arange(NB, dtype=torch.int32).view(n, NB // n)
    for b, L in enumerate(kv_lens):
        for p in range(L - 1):
            planes[int(table[b, p // BS]), 0, p % BS] = seq_k[b][p]
            planes[int(table[b, p // BS]), 1, p % BS] = seq_v[b][p]
    q = torch.randn(n, NQ * D, generator=g)
    k = torch.stack([seq_k[b][L - 1] for b, L in enumerate(kv_lens)]).view(n, -1)
    v = torch.stack([seq_v[b][L - 1] for b, L in enumerate(kv_lens)]).view(n, -1)
    config.compilation_config.static_forward_context[LAYER].kv_cache = cache
    with set_forward_context({LAYER: _metadata(kv_lens)}, config):
        out = fn(q, k, v)
    expected = torch.cat([
        dense_attention(q.view(n, 1, NQ, D)[b], seq_k[b][:L], seq_v[b][:L], D**-0.5,
                        lambda i, j: True)[0] for b, L in enumerate(kv_lens)]).float()
    return out.view(n, NQ, D), expected


def _compile(attn):
    """Dynamo over one attention layer as vLLM compiles (whole graph, static shapes);
    returns (compiled module, the FX graphs Dynamo produced)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(OneLayer(attn), backend=backend, fullgraph=True, dynamic=False)
    return compiled, graphs


def test_compiled_graph_holds_one_opaque_attention_call_and_no_step_values(npu_platform):
    config, attn = _attention_layer(npu_platform)
    assert attn.use_direct_call is False          # the NPU platform's opaque attention
    compiled, graphs = _compile(attn)
    for seed, kv_lens in enumerate(STEPS):
        out, expected = _step(config, compiled, kv_lens, seed)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert len(graphs) == 1                        # one graph served both steps
    code = graphs[0].code
    assert "torch.ops.vllm.unified_attention_with_output" in code
    for kv_lens in STEPS:                          # no step's lengths in the graph
        assert repr(list(kv_lens)) not in code and repr(tuple(kv_lens)) not in code
    targets = {str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"}
    assert not any("fused_infer_attention" in t for t in targets)


def test_negative_control_a_direct_call_does_not_give_one_graph_for_both_steps(npu_platform):
    config, attn = _attention_layer(npu_platform)
    attn.use_direct_call = True                    # what a non-opaque platform gets
    compiled, graphs = _compile(attn)
    try:
        for seed, kv_lens in enumerate(STEPS):
            _step(config, compiled, kv_lens, seed)
    except torch._dynamo.exc.Unsupported:          # the backend's host work: untraceable
        return
    # Traced through: the per-step values were guarded on (one graph per step), which
    # vLLM's compiler, running with guards dropped, would have replayed stale.
    assert len(graphs) > 1
