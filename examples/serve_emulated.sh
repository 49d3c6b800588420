#!/usr/bin/env bash
# OpenAI-compatible server with the plugin, emulated on the CPU, on 127.0.0.1:8000.
# Ctrl-C stops it in order (docs/quickstart-cpu.md, "Stopping").
set -euo pipefail
ASCEND_EXT_EMULATE=1 python -m vllm_ascend_ext serve "$(python -m vllm_ascend_ext tiny-model-path)" \
  --served-model-name tiny-qwen3 --dtype float32 --host 127.0.0.1 --port 8000 \
  --additional-config '{"ascend_ext": {"mixed_split": "auto"}}'
# then: curl http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \
#   -d '{"model": "tiny-qwen3", "prompt": "the quick brown fox", "max_tokens": 16}'
