"""The emulated platform's worker: vLLM's CPU worker with the plugin's orderly stop."""

from __future__ import annotations

from vllm.v1.worker.cpu_worker import CPUWorker

from vllm_ascend_ext.worker.orderly_stop import leave_ctrl_c_to_engine, log_final_summaries


class EmulatedAscendWorker(CPUWorker):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        leave_ctrl_c_to_engine(self.parallel_config)

    def shutdown(self) -> None:
        log_final_summaries(getattr(self, "model_runner", None))
        super().shutdown()
