"""Platform classes: ``npu.AscendNPUPlatform``; emulation subclasses it in the emulation package."""
