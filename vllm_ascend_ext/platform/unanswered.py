"""vLLM platform hooks the NPU platform does not answer, and the options that reach them.

vLLM's base ``Platform`` raises ``NotImplementedError`` for a few hooks a device platform
must define; the NPU platform leaves four undefined because only an opt-in vLLM feature
calls them, and each such feature is refused before serving starts, naming the option
(``refuse``; ``tests/ut/platform/test_platform_conformance.py`` holds every hook vLLM 0.32 calls to
an answer). Expert load balancing and elastic EP, which reach
``stateless_init_device_torch_dist_pg`` through vLLM's stateless groups, are refused with
the MoE refusals (``config_hooks.refuse_expert_parallel``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from vllm_ascend_ext.errors import AscendExtError

NIC_MAPPING_ENV = "VLLM_GPU_NIC_PCIE_MAPPING"
IPC_LOAD_FORMAT = "ipc_cache"

# hook -> the option that reaches it (the refusal's subject)
HOOKS: dict[str, str] = {
    "get_punica_wrapper": "--enable-lora",
    "get_device_uuid": f"--load-format {IPC_LOAD_FORMAT}",
    "get_all_gpu_pci_bus_ids": NIC_MAPPING_ENV,
    "stateless_init_device_torch_dist_pg": "--enable-eplb / --enable-elastic-ep",
}


def refuse(vllm_config, environ: Mapping[str, str] = os.environ) -> None:
    """Refuse, by name, an option whose vLLM implementation needs one of ``HOOKS``."""
    if getattr(vllm_config, "lora_config", None) is not None:
        raise AscendExtError(
            "--enable-lora: vLLM's LoRA layers run its punica kernels "
            "(Platform.get_punica_wrapper), which the Ascend NPU platform does not provide; "
            "serve without --enable-lora (merge the adapter into the weights instead)")
    load = getattr(vllm_config, "load_config", None)
    if getattr(load, "load_format", None) == IPC_LOAD_FORMAT:
        raise AscendExtError(
            f"--load-format {IPC_LOAD_FORMAT}: vLLM's weight-cache daemon keys weights by the "
            "GPU's UUID (Platform.get_device_uuid), which the Ascend NPU platform does not "
            "report; use --load-format auto or safetensors")
    if environ.get(NIC_MAPPING_ENV, "").strip():
        raise AscendExtError(
            f"{NIC_MAPPING_ENV} is set: vLLM maps CUDA devices to NICs by PCI bus id "
            "(Platform.get_all_gpu_pci_bus_ids); on an Atlas host HCCL chooses the NICs "
            f"(HCCL_SOCKET_IFNAME / the rank table). Unset {NIC_MAPPING_ENV}")
