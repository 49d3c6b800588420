"""``serve`` under a small supervisor, so that stopping a server is orderly and bounded.

Ctrl-C in a terminal signals the whole foreground process group: vLLM's API server, its
engine core and its workers all at once, and ``systemctl stop`` does the same with
SIGTERM. vLLM 0.32 then races itself (workers die under the step in flight; the API
server force-kills the engine core it just asked to stop), and a drain that outlasts
``--shutdown-timeout`` leaves in-flight requests hanging forever: the engine core is
killed at the deadline, nobody fails those requests, and uvicorn waits for their
connections.

So ``python -m vllm_ascend_ext serve ...`` runs vLLM's server (the same command, same
arguments) as a child in its own session, which terminal signals do not reach, and
stands in front of it:

- first SIGINT/SIGTERM: one SIGTERM to the API server, which stops in order (drain up
  to ``--shutdown-timeout``, engine core, workers, end-of-run summaries);
- a second SIGINT/SIGTERM, or no exit within ``--shutdown-timeout`` + ``GRACE_S``:
  SIGKILL to the server's whole session, said in one line;
- the server gets SIGTERM if the supervisor itself dies (``PR_SET_PDEATHSIG``);
- the exit code is the server's (0 after an orderly stop).

The supervisor imports neither torch nor vLLM: it costs a bare Python process.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

SERVER_MODULE = "vllm_ascend_ext.cli.server_process"
# Seconds an orderly stop may spend finishing in-flight requests (vLLM's default: 0).
DEFAULT_SHUTDOWN_TIMEOUT_S = 10
GRACE_S = 15.0  # beyond the drain: engine-core and worker teardown
PR_SET_PDEATHSIG = 1


def shutdown_timeout(argv: list[str], default: float) -> float:
    """``--shutdown-timeout`` as given on the command line (either spelling), else default."""
    value = None
    for i, arg in enumerate(argv):
        for name in ("--shutdown-timeout", "--shutdown_timeout"):
            if arg == name and i + 1 < len(argv):
                value = argv[i + 1]
            elif arg.startswith(name + "="):
                value = arg.split("=", 1)[1]
    try:
        return float(value) if value is not None else default
    except ValueError:
        return default  # vLLM's parser reports it


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the server outlives a killed supervisor
        pass


def _say(message: str) -> None:
    print(f"ascend_ext serve: {message}", file=sys.stderr, flush=True)


def supervise(argv: list[str], server: list[str] | None = None, grace_s: float = GRACE_S) -> int:
    """Run ``serve argv`` in a child session until it exits; return its exit code.

    ``server`` is the command the arguments are appended to (default: the plugin's
    server process module); tests pass a stand-in.
    """
    budget = shutdown_timeout(argv, DEFAULT_SHUTDOWN_TIMEOUT_S) + grace_s
    server = server or [sys.executable, "-m", SERVER_MODULE]
    proc = subprocess.Popen([*server, *argv], start_new_session=True,
                            preexec_fn=_die_with_parent)
    stops: list[float] = []

    def on_signal(signum, frame) -> None:
        stops.append(time.monotonic())
        if len(stops) == 1:
            proc.send_signal(signal.SIGTERM)
            _say(f"stopping: in-flight requests may finish for up to {budget - grace_s:.0f} s "
                 "(--shutdown-timeout); interrupt again to kill the server now")

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            try:
                return _exit_code(proc.wait(timeout=0.2))
            except subprocess.TimeoutExpired:
                pass
            if len(stops) > 1 or (stops and time.monotonic() - stops[0] > budget):
                why = ("second interrupt" if len(stops) > 1 else
                       f"no exit within {budget:.0f} s of the stop request (requests that "
                       "outlast --shutdown-timeout are never answered by vLLM 0.32's server)")
                _say(f"{why}: killing the server (process group {proc.pid})")
                os.killpg(proc.pid, signal.SIGKILL)
                return _exit_code(proc.wait())
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode
