"""The NPU platform's graph wrapper: vLLM's ``CUDAGraphWrapper``, FIA updated per replay.

vLLM's wrapper captures a graph per batch descriptor on first use and replays it after;
in the NPU worker ``torch.cuda.CUDAGraph`` / ``torch.cuda.graph`` are torch.npu's
(``worker/npu_device.py``). Before every replay, whatever path reaches it (a scheduled
step, a data-parallel rank's dummy batch, a warm-up), this wrapper updates the FIA graph
tasks of that graph with the step's host lists (``attention/fia/graph_tasks.py``); a
step whose lists do not fit the graph fails before the replay is launched.
"""

from __future__ import annotations

from typing import Any

from vllm.compilation.cuda_graph import CUDAGraphWrapper
from vllm.config import CUDAGraphMode
from vllm.forward_context import get_forward_context, is_forward_context_available

from vllm_ascend_ext.attention.fia.graph_tasks import update_before_replay


class AscendNPUGraphWrapper(CUDAGraphWrapper):
    def __call__(self, *args: Any, **kwargs: Any) -> Any | None:
        key = self.replay_key()
        if key is not None:
            update_before_replay(get_forward_context().attn_metadata, key)
        return super().__call__(*args, **kwargs)

    def replay_key(self):
        """The batch descriptor this call replays, or None (eager, other mode, capture)."""
        if not is_forward_context_available():
            return None
        ctx = get_forward_context()
        mode = ctx.cudagraph_runtime_mode
        if mode == CUDAGraphMode.NONE or mode != self.runtime_mode:
            return None
        entry = self.concrete_cudagraph_entries.get(ctx.batch_descriptor)
        if entry is None or entry.cudagraph is None:
            return None
        return ctx.batch_descriptor
