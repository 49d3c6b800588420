"""The plugin's fused-MoE method: routing and experts on torch_npu's MoE operators."""
