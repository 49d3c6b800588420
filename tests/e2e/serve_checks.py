"""What the multi-process serving tests check of a running OpenAI server and of the
processes behind it: greedy completions with logprobs, the server's process sessions
(what must be gone after the stop), the first unexpected traceback in a log."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path

# A starting server is judged by its progress, not by a clock: it fails once its log has
# not grown for STALL_S (a hung start) or after CAP_S in all (a start that keeps logging
# without coming up); a loaded machine only slows the lines down.
STALL_S = 300.0
CAP_S = 900.0


def complete(port: int, model: str, prompt: str, max_tokens: int) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "logprobs": 1, "ignore_eos": True, "return_tokens_as_token_ids": True}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        lp = json.loads(r.read())["choices"][0]["logprobs"]
    return {"tokens": [int(t.split(":", 1)[1]) for t in lp["tokens"]],
            "logprobs": lp["token_logprobs"]}


def wait_healthy(procs, port: int, logs: list[Path], stall_s: float = STALL_S,
                 cap_s: float = CAP_S) -> None:
    """Until ``/health`` answers on ``port``: fails naming the logs' tails when a process
    of ``procs`` exits, when no log has grown for ``stall_s`` or after ``cap_s``."""
    start = last = time.monotonic()
    size = -1
    while True:
        assert all(p.poll() is None for p in procs), "a server process exited\n" + tails(logs)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return
        except OSError:
            pass
        now = time.monotonic()
        grown = sum(Path(p).stat().st_size for p in logs if Path(p).exists())
        if grown != size:
            size, last = grown, now
        assert now - last < stall_s, f"no start-up progress for {stall_s:g} s\n" + tails(logs)
        assert now - start < cap_s, f"not ready after {cap_s:g} s\n" + tails(logs)
        time.sleep(min(1.0, stall_s / 4))


def server_sessions(nodes) -> set[int]:
    """The sessions of the servers the plugin's supervisors started (each its own)."""
    import psutil

    found = set()
    for node in nodes:
        try:
            found |= {c.pid for c in psutil.Process(node.pid).children()}
        except psutil.NoSuchProcess:
            pass
    return found


def kill_sessions(sessions: set[int]) -> list[int]:
    """Kill what is left of those sessions (a failed start); the pids that were left."""
    import psutil

    left = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getsid(proc.pid) in sessions and proc.info["status"] != psutil.STATUS_ZOMBIE:
                left.append(proc.pid)
                proc.kill()
        except (OSError, psutil.Error):
            pass
    return left


def first_traceback(path) -> str:
    """The first traceback in a node's log with the lines around it, or '' -- less the one
    vLLM 0.32 itself logs at random on a graceful stop (vllm-project/vllm#48745: the API
    server's output handler reads the EngineDeadError its own output queue posts when
    shutdown cancels it): an ``AsyncLLM output_handler failed`` / EngineDeadError logged by
    a process after that process's ``[shutdown]`` had begun."""
    lines = path.read_text(errors="replace").splitlines()
    for i, line in enumerate(lines):
        if "Traceback" not in line:
            continue
        pid = line.split(")", 1)[0] + ")" if line.startswith("(") else None
        stopping = pid is not None and any(
            earlier.startswith(pid) and "[shutdown]" in earlier for earlier in lines[:i])
        benign = (stopping and i > 0 and "AsyncLLM output_handler failed" in lines[i - 1]
                  and any(nxt.startswith(pid) and "EngineDeadError" in nxt
                          for nxt in lines[i + 1:i + 12]))
        if not benign:
            return f"{path.name}:\n" + "\n".join(lines[max(0, i - 10):i + 40])
    return ""


def tails(paths) -> str:
    from tests.e2e.nightly.serving import tail

    return "\n----\n".join(tail(path, 60) for path in paths)
