#!/usr/bin/env bash
# The nightly Atlas 800 suite (docs/nightly.md).
#
#   bash tests/e2e/nightly/run.sh [--dry-run] [--out DIR] [--repeats N]
#
# doctor -> NPU parity suite -> contract-mode smoke -> tiny models served -> real models
# served (NIGHTLY_* variables) -> two-node DP + EP recipe -> FIA split sweep; writes DIR/report.md, DIR/speed.png,
# DIR/results.json and DIR/logs/. Exit 0 when every gate passed, 1 otherwise, 2 without
# an NPU unless --dry-run; PYTHON picks the interpreter (default: python on PATH) (the whole suite on the CPU, in emulation, with the tiny models).
set -euo pipefail
cd "$(dirname "$0")/../../.."
exec "${PYTHON:-python}" -m tests.e2e.nightly.suite "$@"
