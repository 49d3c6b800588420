"""Emulation's own room: everything that exists only to run the plugin without an NPU.

* ``platform``: ``EmulatedAscendPlatform``, the NPU platform on a CPU stand-in device;
  ``cpu_platform``: vLLM's CPU platform with the plugin's backends (the comparison engine);
* ``cpu_npu`` / ``cpu_npu_graph``: the CPU stand-in of the NPU device runtime and its
  graph recorder;
* ``npu_worker``: the NPU worker and runner on the stand-in; ``cpu_worker``: vLLM's CPU
  worker for comparison;
* ``kv_budget`` and ``allocator``: the KV-cache size and the host allocator of a shared CPU.

The production path (``platform``, ``worker``, ``attention``, ``moe``, ``ops``, ...)
imports nothing from here (``tests/ut/emulation/test_emulation_boundary.py``); the device runtime
offers the layers its kernels through one registry (``worker/npu_device.py``).
"""
