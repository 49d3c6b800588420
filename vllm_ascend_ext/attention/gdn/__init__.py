"""The plugin's Gated-DeltaNet (linear attention) layers for Qwen3-Next / Qwen3.5."""
