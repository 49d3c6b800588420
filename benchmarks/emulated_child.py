"""One benchmark variant in an emulated engine process of its own: the benchmark script
run again with ``--child VARIANT`` and its other arguments; its ``RESULT {json}`` line."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def run_child(script: str, variant: str, *args: str) -> dict:
    env = dict(os.environ, ASCEND_EXT_EMULATE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0",
               VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    proc = subprocess.run([sys.executable, script, "--child", variant, *args], env=env,
                          capture_output=True, text=True, check=False)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode or line is None:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"{variant} run failed (rc {proc.returncode})")
    return json.loads(line[len("RESULT "):])
