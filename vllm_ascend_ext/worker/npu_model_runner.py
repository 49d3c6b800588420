"""The NPU model runner: vLLM's V1 GPU model runner, plus FIA's graph-task updates.

Built by ``AscendNPUWorker`` after it has routed ``torch.cuda``'s stream, event and
graph names to ``torch.npu`` (``worker/npu_device.py``), so the inherited runner's
streams, events and graph capture (vLLM's ``CUDAGraphWrapper`` over ``torch.npu.graph``)
are the NPU's. KV-cache allocation stays vLLM's: the FIA backend reads its K and V as
contiguous plane views of vLLM's blocks (``attention/kv_layout.py``), and SFA's three
caches are separate cache layers, so no NPU kernel needs a layout vLLM does not give.

What it adds: after every FULL graph replay, each captured FIA call's host lists are
updated to this step's (``attention/fia/graph_tasks.py``); ``_model_forward`` is vLLM's
documented override point for that.
"""

from __future__ import annotations

from vllm.config import CUDAGraphMode
from vllm.forward_context import get_forward_context
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from vllm_ascend_ext.attention.fia import graph_tasks


class AscendNPUModelRunner(GPUModelRunner):
    """vLLM's V1 GPU model runner on an Ascend NPU (see module docstring)."""

    def _model_forward(self, *args, **kwargs):
        output = super()._model_forward(*args, **kwargs)
        update_graph_tasks(get_forward_context())
        return output


def update_graph_tasks(ctx) -> int:
    """After a FULL graph replay, update the FIA tasks of the replayed graph; returns how
    many were updated (0 on eager and piecewise steps, and while capturing)."""
    if ctx.cudagraph_runtime_mode != CUDAGraphMode.FULL or ctx.batch_descriptor is None:
        return 0
    return graph_tasks.update_step(ctx.attn_metadata, ctx.batch_descriptor.num_tokens)
