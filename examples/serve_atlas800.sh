#!/usr/bin/env bash
# On an Atlas 800 A2/A3 or Ascend 950 host with CANN, torch_npu and an Ascend build of
# vLLM 0.32 installed (pip install -e ".[npu]"). The plugin detects the NPU itself.
# If vllm-ascend is installed too, VLLM_PLUGINS selects this plugin.
set -euo pipefail
MODEL=${1:?usage: serve_atlas800.sh MODEL}
VLLM_PLUGINS=ascend_ext python -m vllm_ascend_ext serve "$MODEL" \
  --dtype bfloat16 --additional-config '{"ascend_ext": {"mixed_split": "auto"}}'
