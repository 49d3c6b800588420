"""Ctrl-C (SIGINT) or SIGTERM while ``python -m vllm_ascend_ext serve`` is still starting:
the server stops within seconds with the interrupted status (130 / 143), one line says
what was interrupted, no traceback, and no process of the server is left. Interrupted at
two phases: while the server process imports vLLM, and while the engine loads the model."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

from tests.e2e.conftest import REPO, child_env
from tests.e2e.nightly.serving import free_port
from vllm_ascend_ext.models import tiny_model_path

pytestmark = pytest.mark.e2e


def _interrupt(sig: int, after_line: str | None, delay_s: float = 0.0):
    env = child_env(emulate=True)
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")     # as a user's server runs
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vllm_ascend_ext", "serve", tiny_model_path(), "--host",
             "127.0.0.1", "--port", str(free_port()), "--dtype", "float32"],
            cwd=str(REPO), env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 300
        while after_line is not None:
            log.seek(0)
            if after_line in log.read():
                break
            assert proc.poll() is None and time.monotonic() < deadline, "server ended early"
            time.sleep(0.1)
        time.sleep(delay_s)
        server = [c.pid for c in psutil.Process(proc.pid).children()]
        t0 = time.monotonic()
        proc.send_signal(sig)
        code = proc.wait(timeout=60)
        took = time.monotonic() - t0
        time.sleep(0.5)
        log.seek(0)
        out = log.read()
    # dead processes may stay zombies where nothing reaps orphans (a container's PID 1)
    left = [p for p in psutil.process_iter(["pid", "status"]) if server and
            _session(p.pid) == server[0] and p.info["status"] != psutil.STATUS_ZOMBIE]
    return code, took, out, left


def _session(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def test_interrupt_while_importing_vllm():
    code, took, out, left = _interrupt(signal.SIGINT, None, delay_s=1.0)
    assert code == 130 and took < 5, (code, took, out[-2000:])
    assert ("interrupted (SIGINT) while starting the server process (importing vLLM, "
            "reading the arguments): nothing is served yet") in out, out[-2000:]
    assert "Traceback" not in out and not left


def test_terminate_while_the_engine_loads_the_model():
    code, took, out, left = _interrupt(signal.SIGTERM, "Starting to load model")
    assert code == 143 and took < 5, (code, took, out[-2000:])
    assert ("interrupted (SIGTERM) while starting the engine (loading the model, compiling, "
            "allocating the KV cache): nothing is served yet") in out, out[-3000:]
    assert "stopped before it served" in out
    assert "Traceback" not in out and "in-flight requests" not in out and not left
