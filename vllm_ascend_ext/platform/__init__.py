"""Platform classes: ``npu.AscendNPUPlatform`` and ``emulated.EmulatedAscendPlatform``."""
