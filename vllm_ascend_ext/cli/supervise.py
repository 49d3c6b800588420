"""``serve`` under a small supervisor, so that stopping a server is orderly and bounded.

Ctrl-C in a terminal signals the whole foreground process group: vLLM's API server, its
engine core and its workers all at once. vLLM 0.32 then races itself (workers die under
the step in flight; the API server force-kills the engine core it just asked to stop),
and a drain that outlasts ``--shutdown-timeout`` leaves in-flight requests hanging
forever: the engine core is killed at the deadline, nobody fails those requests, and
uvicorn waits for their connections.

So ``python -m vllm_ascend_ext serve ...`` runs vLLM's server (the same command, same
arguments) as a child in its own session, which terminal signals do not reach, and
stands in front of it:

- first SIGINT/SIGTERM: one SIGTERM to the API server, which stops in order (drain up
  to ``--shutdown-timeout``, engine core, workers, end-of-run summaries);
- a second SIGINT/SIGTERM, or no exit within ``--shutdown-timeout`` + ``GRACE_S``:
  SIGKILL to the server's whole session, said in one line. The server reports the
  drain window vLLM's parser gave it (command line, ``--config`` file, defaults)
  through a pipe, so the supervisor never parses vLLM's options itself;
- the server gets SIGTERM if the supervisor itself dies (``PR_SET_PDEATHSIG``);
- the exit code is the server's (0 after an orderly stop).

A service manager that signals every process of the service (systemd's default
``KillMode=control-group``) reaches the server too; ``KillMode=mixed`` signals only the
supervisor. The supervisor imports neither torch nor vLLM: it costs a bare Python process.
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
# The server writes its effective --shutdown-timeout to this inherited descriptor.
REPORT_FD_ENV = "ASCEND_EXT_SERVE_REPORT_FD"
PR_SET_PDEATHSIG = 1


def report_shutdown_timeout(seconds: float) -> None:
    """In the server process: tell the supervisor (if any) the drain window in use."""
    fd = os.environ.pop(REPORT_FD_ENV, None)
    if fd is None:
        return
    try:
        os.write(int(fd), f"{seconds}\n".encode())
        os.close(int(fd))
    except (OSError, ValueError):  # no supervisor listening: nothing to tell
        pass


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the server outlives a killed supervisor
        pass


def _say(message: str) -> None:
    print(f"ascend_ext serve: {message}", file=sys.stderr, flush=True)


class _Stops:
    """Stop requests (signal times) and the drain window, as the server reported it."""

    def __init__(self, grace_s: float) -> None:
        self.times: list[float] = []
        self.drain_s = float(DEFAULT_SHUTDOWN_TIMEOUT_S)
        self.grace_s = grace_s

    def read_report(self, fd: int) -> None:
        try:
            data = os.read(fd, 64)
        except BlockingIOError:
            return
        if data.strip():
            self.drain_s = float(data.decode().split()[0])

    def overdue(self, now: float) -> str | None:
        if len(self.times) > 1:
            return "second interrupt"
        if self.times and now - self.times[0] > self.drain_s + self.grace_s:
            return (f"no exit within {self.drain_s + self.grace_s:.0f} s of the stop request "
                    "(requests that outlast --shutdown-timeout are never answered by vLLM "
                    "0.32's server)")
        return None


def supervise(argv: list[str], server: list[str] | None = None, grace_s: float = GRACE_S) -> int:
    """Run ``serve argv`` in a child session until it exits; return its exit code.

    ``server`` is the command the arguments are appended to (default: the plugin's
    server process module); tests pass a stand-in.
    """
    stops = _Stops(grace_s)
    proc: subprocess.Popen | None = None

    def on_signal(signum, frame) -> None:
        stops.times.append(time.monotonic())
        if len(stops.times) == 1 and proc is not None:
            proc.send_signal(signal.SIGTERM)
            _say(f"stopping: in-flight requests may finish for up to {stops.drain_s:.0f} s "
                 "(--shutdown-timeout); interrupt again to kill the server now")

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    report_r, report_w = os.pipe()
    os.set_blocking(report_r, False)
    try:
        server = server or [sys.executable, "-m", SERVER_MODULE]
        proc = subprocess.Popen([*server, *argv], start_new_session=True,
                                preexec_fn=_die_with_parent, pass_fds=(report_w,),
                                env={**os.environ, REPORT_FD_ENV: str(report_w)})
        os.close(report_w)
        if stops.times:  # a stop requested while the server was being started
            proc.send_signal(signal.SIGTERM)
        while True:
            try:
                return _exit_code(proc.wait(timeout=0.2))
            except subprocess.TimeoutExpired:
                pass
            stops.read_report(report_r)
            why = stops.overdue(time.monotonic())
            if why:
                _say(f"{why}: killing the server (process group {proc.pid})")
                os.killpg(proc.pid, signal.SIGKILL)
                return _exit_code(proc.wait())
    finally:
        os.close(report_r)
        for s, handler in previous.items():
            signal.signal(s, handler)


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode
