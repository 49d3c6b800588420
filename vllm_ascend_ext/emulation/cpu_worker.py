"""The emulated platform's worker: vLLM's CPU worker with the plugin's orderly stop and
its model runner (``worker/kv_zeroing.py``: KV-block zeroing by scheduler block)."""

from __future__ import annotations

import torch
from vllm.logger import init_logger
from vllm.v1.worker.cpu_worker import CPUWorker

from vllm_ascend_ext.worker.orderly_stop import leave_ctrl_c_to_engine, log_final_summaries

logger = init_logger("vllm.ascend_ext")


class EmulatedAscendWorker(CPUWorker):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        leave_ctrl_c_to_engine(self.parallel_config)

    def init_device(self) -> None:
        super().init_device()
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner

        from vllm_ascend_ext.worker.kv_zeroing import EmulatedAscendModelRunner

        # vLLM's CPU worker builds its V1 runner last in init_device; the emulated
        # platform's runner replaces it before anything has used it.
        if type(self.model_runner) is CPUModelRunner:
            self.model_runner = EmulatedAscendModelRunner(self.vllm_config,
                                                          torch.device("cpu"))
        logger.info_once("ascend_ext: emulated worker %s (vLLM's CPU worker), runner %s",
                         type(self).__name__, type(self.model_runner).__name__)

    def shutdown(self) -> None:
        log_final_summaries(getattr(self, "model_runner", None))
        super().shutdown()
