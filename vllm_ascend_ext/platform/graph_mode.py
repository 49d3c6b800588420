"""Which graphs the NPU engine captures, and why: the pure decision, and the start-up
default that applies it (``platform/startup.py``) on an NPU and on its CPU stand-in.

* Decode-only steps replay captured NPU graphs (``FULL_DECODE_ONLY``): each FIA call in
  them is a graph task whose host lists the runner updates on every replay
  (``attention/fia/graph_tasks.py``). With MTP, verify-only steps are decode steps too:
  uniform batches of ``1 + k`` tokens per request, captured for multiples of ``1 + k``.
  Prefill and mixed steps run eager: their FIA calls take a split the gate decides per
  step, which a replayed graph cannot.
* Piecewise graphs are not offered: they would capture the non-attention pieces of
  prefill steps through code paths nothing here has exercised. Where vLLM itself chose
  PIECEWISE (pooling models, KV connectors that need it), every step runs eager.
* Tensor- and data-parallel runs keep decode graphs: their collectives (TP all-reduces,
  the DP token exchange, MC2) are captured into the graph like any other kernel and
  replayed on the same buffers (``distributed/communicator.py`` says how the plugin's
  communicator passes vLLM's graph-capture context). A graph step never takes the MoE
  all-to-all, whose split sizes are read on the host (``moe/step_route.py``).
* Pipeline-parallel runs are eager: graphs across pipeline stages are not exercised.
* SFA models (DeepSeek-V3.2 / GLM-5) run eager: sparse attention's per-step host lists
  have no replay update yet; the SFA builder declares no graph support.
* ``--enforce-eager`` (or ``cudagraph_mode`` NONE) runs every step eager.

What eager decode costs is stated in docs/atlas.md ("Graphs on an NPU").
"""

from __future__ import annotations

from vllm.config import CUDAGraphMode
from vllm.logger import init_logger

logger = init_logger("vllm.ascend_ext")

DECODE_GRAPHS = CUDAGraphMode.FULL_DECODE_ONLY


def decide_graph_mode(requested: CUDAGraphMode, *, enforce_eager: bool, sparse: bool,
                      pipeline_stages: int = 1, hybrid: bool = False) -> tuple[CUDAGraphMode, str]:
    """(mode the NPU platform runs, why) for vLLM's resolved ``cudagraph_mode``;
    ``pipeline_stages``: the pipeline-parallel size."""
    if enforce_eager or requested == CUDAGraphMode.NONE:
        return CUDAGraphMode.NONE, "eager: --enforce-eager or cudagraph_mode NONE"
    if sparse:
        return CUDAGraphMode.NONE, ("eager: the SFA backend has no replay update for sparse "
                                    "attention's host lists")
    if hybrid:
        return CUDAGraphMode.NONE, ("eager: the plugin's Gated-DeltaNet layers have no graph "
                                    "replay update for their per-step state indices")
    if requested == CUDAGraphMode.PIECEWISE:
        return CUDAGraphMode.NONE, ("eager: vLLM chose piecewise graphs (a pooling model or a "
                                    "KV connector that needs them); the NPU platform offers "
                                    "decode graphs only")
    if pipeline_stages > 1:
        return CUDAGraphMode.NONE, (f"eager: {pipeline_stages} pipeline stages (decode graphs "
                                    "across pipeline stages are not exercised here)")
    why = ("decode steps replay captured NPU graphs with FIA's host lists updated per "
           "replay; prefill and mixed steps run eager")
    if requested != DECODE_GRAPHS:
        why += f" (cudagraph_mode {requested.name} is not offered on the NPU)"
    return DECODE_GRAPHS, why


def apply_graph_mode(vllm_config, *, sparse: bool,
                     hybrid: bool = False) -> tuple[CUDAGraphMode, str]:
    """Set ``cudagraph_mode`` to the decision (no capture sizes when eager); ``sparse`` and
    ``hybrid``: the start's model facts."""
    comp = vllm_config.compilation_config
    model = vllm_config.model_config
    parallel = vllm_config.parallel_config
    mode, why = decide_graph_mode(comp.cudagraph_mode,
                                  enforce_eager=bool(model and model.enforce_eager),
                                  sparse=sparse, hybrid=hybrid,
                                  pipeline_stages=getattr(parallel, "pipeline_parallel_size", 1))
    if mode != comp.cudagraph_mode:
        logger.info("ascend_ext: cudagraph_mode %s -> %s: %s", comp.cudagraph_mode.name,
                    mode.name, why)
    comp.cudagraph_mode = mode
    if mode == CUDAGraphMode.NONE:
        comp.cudagraph_capture_sizes = []
        comp.max_cudagraph_capture_size = 0
    return mode, why
