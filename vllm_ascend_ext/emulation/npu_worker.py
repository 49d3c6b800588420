"""The emulated platform's engine path: the plugin's NPU worker and NPU model runner on the
CPU stand-in of the NPU device runtime (``emulation/cpu_npu.py``).

These are the classes an Atlas host runs (``AscendNPUWorker`` and ``AscendNPUModelRunner``,
vLLM's GPU worker and V1 GPU runner underneath); the subclasses change only what a CPU
cannot be:

* the device module is the stand-in, installed as this process's ``torch.accelerator``
  device functions and ``torch.Event``, and the torch device is ``cpu``;
* ``torch.ops._C.weak_ref_tensor`` (vLLM's graph capture; vLLM's CPU build has none) is
  an alias of its input for the CPU: a captured graph keeps its outputs alive itself;
* the runner's host copies of step results go through ``tolist`` (vLLM's CPU runner
  does the same: a CPU build has no pinned memory to copy into);
* seeded requests' generators get the offset an NPU generator has
  (``cpu_npu.OffsetGenerator``): the runner rewinds a discarded partial prefill's draws
  by it (``worker/seeded_draws.py``).

Everything else — input preparation, the metadata builders, graph capture and replay with
the FIA graph-task update before each replay, the kernel substitutes, block zeroing —
is the NPU path's own code.
"""

from __future__ import annotations

import torch
from vllm.logger import init_logger

from vllm_ascend_ext.emulation import cpu_npu
from vllm_ascend_ext.worker import npu_device
from vllm_ascend_ext.worker.npu_model_runner import AscendNPUModelRunner
from vllm_ascend_ext.worker.npu_worker import AscendNPUWorker

logger = init_logger("vllm.ascend_ext")


def stand_in_runtime():
    """A CPU stand-in of torch.npu, installed as this process's accelerator."""
    runtime = cpu_npu.make_runtime()
    cpu_npu.install(runtime)
    return runtime


def _cpu_weak_ref(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(tensor.shape)


class EmulatedNPUModelRunner(AscendNPUModelRunner):
    """The NPU model runner on the CPU stand-in (see module docstring)."""

    def _to_list(self, sampled_token_ids: torch.Tensor) -> list[list[int]]:
        return sampled_token_ids.tolist()

    def sample_tokens(self, grammar_output):
        if self.execute_model_state is not None:
            cpu_npu.offset_generators(self.input_batch.generators, self.requests,
                                      self.input_batch.req_ids)
        return super().sample_tokens(grammar_output)


class EmulatedNPUWorker(AscendNPUWorker):
    """The NPU worker on the CPU stand-in (see module docstring)."""

    device_module_factory = staticmethod(stand_in_runtime)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # The stand-in device computes on the host's threads: as many as vLLM gave this
        # worker to start with (its share of the host's CPUs).
        self.device_threads = torch.get_num_threads()

    def load_model(self, *args, **kwargs) -> None:
        super().load_model(*args, **kwargs)
        # vLLM's GPU worker drops the host to one thread for serving (on a device the host
        # only schedules); on the stand-in those threads are the device's compute.
        if torch.get_num_threads() != self.device_threads:
            torch.set_num_threads(self.device_threads)

    def runtime_kernels(self) -> dict:
        # the references of torch_npu's FIA graph-task kernels
        from vllm_ascend_ext.ops import fia

        return {npu_device.FIA_OUT: fia.npu_fused_infer_attention_score_out,
                npu_device.FIA_WORKSPACE: fia.fia_max_workspace}

    def device_for(self, index: int) -> torch.device:
        return torch.device("cpu")

    def provide_weak_ref_tensor(self) -> None:
        npu_device.provide_weak_ref_tensor(_cpu_weak_ref, dispatch_key="CPU")

    def _make_model_runner(self):
        logger.info_once("ascend_ext: emulated engine path: worker %s, runner %s, device "
                         "runtime %s", type(self).__name__, EmulatedNPUModelRunner.__name__,
                         cpu_npu.NAME)
        return EmulatedNPUModelRunner(self.vllm_config, self.device)
