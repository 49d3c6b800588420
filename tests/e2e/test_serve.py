"""README's serve command answers OpenAI-compatible completions on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.e2e.conftest import REPO, child_env

pytestmark = pytest.mark.e2e


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read()


def test_serve_answers_completions():
    port = _free_port()
    env = child_env(emulate=True)
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")  # the server runs as users run it
    cmd = [sys.executable, "-m", "vllm_ascend_ext", "serve", "--dtype", "float32",
           "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "1024"]
    proc = subprocess.Popen(cmd, cwd=str(REPO / "tests"), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 300
        while True:
            assert proc.poll() is None, f"server exited:\n{proc.stdout.read()[-5000:]}"
            try:
                if _get(f"http://127.0.0.1:{port}/health")[0] == 200:
                    break
            except OSError:
                pass
            assert time.time() < deadline, "server did not become healthy in 300 s"
            time.sleep(1)
        body = json.dumps({"model": "tiny-qwen3", "prompt": "the quick brown fox",
                           "max_tokens": 8, "temperature": 0, "logprobs": 1}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            out = json.loads(r.read())
        choice = out["choices"][0]
        assert out["usage"]["completion_tokens"] == 8
        assert len(choice["logprobs"]["token_logprobs"]) == 8
        assert choice["finish_reason"] == "length"
    finally:
        proc.terminate()
        try:
            log, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            log, _ = proc.communicate()
    assert "platform=ascend_ext-emulated" in log and "attention_backend=ASCEND_EXT_FIA" in log
