"""Platform classes: ``npu.AscendNPUPlatform`` (emulation subclasses it: ``vllm_ascend_ext.emulation``)."""
