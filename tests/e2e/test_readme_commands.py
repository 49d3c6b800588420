"""Every CPU command block of README.md and docs/*.md, run as written (extracted from the
files themselves, ``tests/readme_blocks.py``).

Blocks run from the repository root in a fresh ``bash -e -o pipefail``, with none of the
plugin's variables and no ``VLLM_CPU_KVCACHE_SPACE`` in the environment (the documentation
must show everything a command needs). A server block runs in its own process group until
the client blocks after it in the same file have run; then four streaming requests are started, and once
each has its first token the whole group gets SIGINT, as Ctrl-C in a terminal sends it:
the server must drain them (every one finishes with all its tokens), log the plugin's
end-of-run summary, print no traceback and no ERROR line, and exit 0.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests import readme_blocks as rb
from tests.e2e import engine_cache
from tests.e2e.serve_checks import wait_healthy

pytestmark = pytest.mark.e2e

REPO = rb.REPO
BLOCK_TIMEOUT_S = 900
IN_FLIGHT, IN_FLIGHT_TOKENS = 4, 48


def _steps() -> list[list[rb.Block]]:
    """One step per RUN, FAILS or SERVER block of every file, a server's clients with it
    (a client always follows its server in the same file: tests/ut/suite/test_readme_ci.py)."""
    steps: list[list[rb.Block]] = []
    for path in rb.doc_files():
        server: list[rb.Block] | None = None
        for block in rb.parse(path=path):
            if block.kind == rb.CLIENT:
                assert server is not None, f"{block.where()}: client block without a server above"
                server.append(block)
            elif block.kind in (rb.RUN, rb.FAILS, rb.SERVER):
                steps.append([block])
                server = steps[-1] if block.kind == rb.SERVER else None
            elif block.kind is not None:
                server = None
    return steps


def _env() -> dict[str, str]:
    drop = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_PLUGINS")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_EXT_") and k not in drop}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _bash(text: str) -> list[str]:
    return ["bash", "-e", "-o", "pipefail", "-c", text]


def _run(block: rb.Block) -> tuple[int, str]:
    proc = subprocess.run(_bash(block.text), cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=BLOCK_TIMEOUT_S)
    engine_cache.CACHE.count_starts("doc-commands", proc.stdout)
    return proc.returncode, proc.stdout


def _check_output(block: rb.Block, output: str) -> None:
    problem = rb.output_mismatch(block, output) if block.expected else None
    assert problem is None, f"{block.where()}: {problem}\n{output[-3000:]}"
    assert "Traceback" not in output, f"{block.where()}:\n{output[-4000:]}"
    if "python -m vllm_ascend_ext" in block.text:  # the CLI ends without teardown noise
        assert "nanobind: leaked" not in output, f"{block.where()}:\n{output[-2000:]}"
    if "Serving Benchmark Result" in output:  # vLLM's bench serve summary
        wanted = int(re.search(r"--num-prompts (\d+)", block.text).group(1))
        done = int(re.search(r"Successful requests:\s+(\d+)", output).group(1))
        assert done == wanted, f"{block.where()}: {done}/{wanted} requests succeeded"


def _stream(port: int, model: str, started: threading.Event, result: dict) -> None:
    body = json.dumps({"model": model, "prompt": "the quick brown fox", "stream": True,
                       "max_tokens": IN_FLIGHT_TOKENS, "ignore_eos": True,
                       "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("choices"):
                    started.set()
                    result["finish"] = chunk["choices"][0].get("finish_reason") or result.get(
                        "finish")
                if chunk.get("usage"):
                    result["tokens"] = chunk["usage"]["completion_tokens"]
    except Exception as exc:  # noqa: BLE001 - reported by the assertion below
        result["error"] = repr(exc)
    finally:
        started.set()


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _wait_port_closed(port: int, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while _port_open(port):
        assert time.time() < deadline, f"port {port} still in use after {timeout} s"
        time.sleep(0.5)


def _serve_and_stop(step: list[rb.Block], log_path: Path) -> None:
    server, clients = step[0], step[1:]
    port = int(re.search(r"--port (\d+)", server.text).group(1))
    model = re.search(r"--served-model-name (\S+)", server.text).group(1)
    _wait_port_closed(port)  # a server of an earlier step may still be stopping
    with open(log_path, "w") as log:
        proc = subprocess.Popen(_bash(server.text), cwd=REPO, env=_env(), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        try:
            wait_healthy([proc], port, [log_path])
        except AssertionError as exc:
            raise AssertionError(f"{server.where()}: {exc}") from None
        for client in clients:
            code, out = _run(client)
            assert code == 0, f"{client.where()}: exit {code}\n{out[-4000:]}"
            _check_output(client, out)

        # Ctrl-C with requests in flight.
        results = [{} for _ in range(IN_FLIGHT)]
        starts = [threading.Event() for _ in range(IN_FLIGHT)]
        threads = [threading.Thread(target=_stream, args=(port, model, starts[i], results[i]))
                   for i in range(IN_FLIGHT)]
        for t in threads:
            t.start()
        for event in starts:
            assert event.wait(120)
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=120)
        for t in threads:
            t.join(timeout=60)
    finally:
        if proc.poll() is None:  # a failed step: end the server's session too
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.kill()
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        _wait_port_closed(port)
    log = rb.without_vllm_shutdown_race(log_path.read_text())
    engine_cache.CACHE.count_starts("doc-commands", log)
    assert code == 0, f"{server.where()}: exit {code} after Ctrl-C\n{log[-4000:]}"
    assert results == [{"finish": "length", "tokens": IN_FLIGHT_TOKENS}] * IN_FLIGHT, results
    assert "Traceback" not in log, log[log.index("Traceback") - 2000:][:6000]
    assert not [ln for ln in log.splitlines() if " ERROR " in ln]
    assert log.count("ascend_ext: emulated KV cache ") == 1  # sized by the platform, once
    if "attention_backend=ASCEND_EXT_FIA" in log:
        stop = log.index("[shutdown]")
        finals = list(re.finditer(r"ascend_ext mixed-split: .* mixed_steps=(\d+) split=(\d+) "
                                  r"declined=(\d+)", log[stop:]))
        assert len(finals) == 1, "one mixed-split summary at shutdown"
        mixed, split, declined = map(int, finals[0].groups())
        mode = re.search(r'"mixed_split": "(\w+)"', server.text)
        assert mixed > 0 and mixed == split + declined
        if mode and mode.group(1) == "on":
            assert split == mixed
        if mode and mode.group(1) == "off":
            assert split == 0


STEPS = _steps()


@pytest.mark.parametrize("step", STEPS, ids=[
    f"{s[0].stem}-line{s[0].line}-{s[0].kind}-" + re.sub(r"\W+", "_", s[0].text.splitlines()[1])[:48]
    for s in STEPS])
def test_readme_cpu_command(step):
    block = step[0]
    if block.kind == rb.SERVER:
        with tempfile.TemporaryDirectory() as tmp:
            _serve_and_stop(step, Path(tmp) / "server.log")
        return
    code, out = _run(block)
    expected_code = 2 if block.kind == rb.FAILS else 0
    assert code == expected_code, f"{block.where()}: exit {code}\n{out[-4000:]}"
    _check_output(block, out)
