"""The NPU contract: every torch_npu call site checked against torch-npu 2.13's own
schemas, official Meta kernels and documented rules, on a CPU (see harness.py)."""
