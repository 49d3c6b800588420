"""A dead engine is a failed server: when the engine process of ``python -m vllm_ascend_ext
serve`` dies while serving (SIGKILL, as a device fault or the OOM killer would), the
client streaming from it gets an error or an end, and the command exits non-zero with one
line naming the process and how it died (vLLM 0.32's own server exits 0 then, so a
restart-on-failure supervisor never restarts it)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import psutil
import pytest

from tests.e2e.conftest import REPO, child_env
from tests.e2e.nightly.serving import free_port
from vllm_ascend_ext.cli.supervise import HealthTarget, health_ok
from vllm_ascend_ext.models import tiny_model_path

pytestmark = pytest.mark.e2e


def _stream(port: int, seen: dict) -> None:
    body = json.dumps({"model": tiny_model_path(), "prompt": "the quick brown fox",
                       "max_tokens": 4000, "stream": True, "ignore_eos": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            for line in r:
                seen.setdefault("chunks", 0)
                seen["chunks"] += 1
                if b"error" in line:
                    seen["error"] = line.decode(errors="replace")
    except Exception as exc:  # noqa: BLE001 - the connection may break: that is an end too
        seen["exception"] = repr(exc)
    seen["ended"] = time.monotonic()


def test_killed_engine_process_fails_the_server_and_is_named():
    env = child_env(emulate=True)
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")     # as a user's server runs: engine in a process
    port = free_port()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vllm_ascend_ext", "serve", tiny_model_path(), "--host",
             "127.0.0.1", "--port", str(port), "--dtype", "float32"],
            cwd=str(REPO), env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 300
            while not health_ok(HealthTarget("127.0.0.1", port)):
                assert proc.poll() is None and time.monotonic() < deadline, "server ended early"
                time.sleep(0.5)
            seen: dict = {}
            client = threading.Thread(target=_stream, args=(port, seen), daemon=True)
            client.start()
            while not seen.get("chunks") and time.monotonic() < deadline:
                time.sleep(0.1)
            engines = [p for p in psutil.Process(proc.pid).children(recursive=True)
                       if "EngineCore" in " ".join(p.cmdline())]
            assert len(engines) == 1, [p.cmdline() for p in psutil.Process(proc.pid).children(True)]
            engine = engines[0]
            t0 = time.monotonic()
            engine.send_signal(signal.SIGKILL)
            code = proc.wait(timeout=90)
            client.join(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        log.seek(0)
        out = log.read()
    assert code == 1, (code, out[-3000:])
    line = [ln for ln in out.splitlines() if "the server stopped because its process" in ln]
    assert len(line) == 1, out[-3000:]
    assert f"(pid {engine.pid}) was killed by SIGKILL; exiting with status 1" in line[0]
    assert "EngineCore" in line[0]
    # the streaming client was not left hanging: an error event or a broken/closed stream
    assert seen.get("ended") and seen["ended"] - t0 < 30, seen
