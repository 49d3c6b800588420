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
from typing import NamedTuple

SERVER_MODULE = "vllm_ascend_ext.cli.server_process"
# Seconds an orderly stop may spend finishing in-flight requests (vLLM's default: 0).
DEFAULT_SHUTDOWN_TIMEOUT_S = 10
GRACE_S = 15.0  # beyond the drain: engine-core and worker teardown
# The server writes its progress to this inherited descriptor: "drain <seconds>" once its
# arguments are parsed (the engine starts next), "ready" once it answers /health.
REPORT_FD_ENV = "ASCEND_EXT_SERVE_REPORT_FD"
PR_SET_PDEATHSIG = 1

# What a server is doing before it serves, by the last report it sent.
STARTING = {
    None: "starting the server process (importing vLLM, reading the arguments)",
    "drain": "starting the engine (loading the model, compiling, allocating the KV cache)",
}


class ServerReport:
    """In the server process: the progress reports to the supervisor (if any)."""

    def __init__(self) -> None:
        fd = os.environ.pop(REPORT_FD_ENV, None)
        self.fd = int(fd) if fd is not None and fd.isdigit() else None

    def send(self, line: str) -> bool:
        if self.fd is None:
            return False
        try:
            os.write(self.fd, f"{line}\n".encode())
            return True
        except OSError:  # no supervisor listening: nothing to tell
            self.close()
            return False

    def close(self) -> None:
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None


class HealthTarget(NamedTuple):
    """Where the server answers ``GET /health``: a TCP host and port (TLS or not), or a
    Unix socket path."""
    host: str | None = None
    port: int | None = None
    tls: bool = False
    unix_path: str | None = None


def report_shutdown_timeout(seconds: float, health: HealthTarget | None = None) -> None:
    """In the server process: tell the supervisor the drain window in use; then, from a
    daemon thread, "ready" once the server answers ``/health`` with 200 (None: it cannot
    be probed, e.g. no HTTP server or client certificates required; it counts as ready at
    once, so a stop always drains)."""
    report = ServerReport()
    if not report.send(f"drain {seconds}"):
        return
    if health is None:
        report.send("ready")
        report.close()
        return
    import threading

    threading.Thread(target=_report_when_healthy, args=(report, health),
                     name="ascend_ext-ready-probe", daemon=True).start()


def health_ok(target: HealthTarget, timeout_s: float = 2.0) -> bool:
    """One ``GET /health`` over a plain socket (no proxy settings apply: the server is
    probed where it listens); True on a 200 status line."""
    import socket

    try:
        if target.unix_path is not None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout_s)
            sock.connect(target.unix_path)
        else:
            sock = socket.create_connection((target.host, target.port), timeout=timeout_s)
        with sock:
            conn = sock
            if target.tls:
                import ssl

                ctx = ssl.create_default_context()
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE  # our own server, on its own address
                conn = ctx.wrap_socket(sock, server_hostname=target.host)
            conn.sendall(b"GET /health HTTP/1.0\r\nHost: localhost\r\n\r\n")
            status = conn.recv(64).split(b"\r\n", 1)[0].split()
            return len(status) >= 2 and status[1] == b"200"
    except (OSError, ValueError):  # not listening or not healthy yet
        return False


def _report_when_healthy(report: ServerReport, target: HealthTarget,
                         period_s: float = 0.25) -> None:
    while not health_ok(target):
        time.sleep(period_s)
    report.send("ready")
    report.close()


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the server outlives a killed supervisor
        pass


def _say(message: str) -> None:
    print(f"ascend_ext serve: {message}", file=sys.stderr, flush=True)


class _Stops:
    """Stop requests (signals and their times), the server's progress and drain window."""

    def __init__(self, grace_s: float) -> None:
        self.times: list[float] = []
        self.signals: list[int] = []
        self.drain_s = float(DEFAULT_SHUTDOWN_TIMEOUT_S)
        self.grace_s = grace_s
        self.progress: str | None = None     # None, "drain", "ready"
        self.stopped_starting = False        # the first stop came before "ready"
        self._pending = b""

    def read_report(self, fd: int) -> None:
        while True:
            try:
                data = os.read(fd, 256)
            except BlockingIOError:
                return
            if not data:
                return
            self._pending += data
            *lines, self._pending = self._pending.split(b"\n")
            for line in lines:
                words = line.decode().split()
                if words[:1] == ["drain"] and len(words) == 2:
                    self.drain_s, self.progress = float(words[1]), "drain"
                elif words[:1] == ["ready"]:
                    self.progress = "ready"

    @property
    def serving(self) -> bool:
        return self.progress == "ready"

    def overdue(self, now: float) -> str | None:
        if len(self.times) > 1:
            return "second interrupt"
        if self.times and now - self.times[0] > self.drain_s + self.grace_s:
            return (f"no exit within {self.drain_s + self.grace_s:.0f} s of the stop request "
                    "(requests that outlast --shutdown-timeout are never answered by vLLM "
                    "0.32's server)")
        return None


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):  # the group is gone already
        pass


def _group_members(pgid: int) -> dict[int, str]:
    """{pid: command line} of the processes in process group ``pgid`` (Linux /proc)."""
    members = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            if int(stat[stat.rindex(")") + 2:].split()[2]) != pgid:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                members[int(entry)] = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):  # exited meanwhile
            continue
    return members


def _kill_starting_server(pgid: int, tracker_wait_s: float = 5.0) -> None:
    """SIGKILL every process of a server that is still starting, except Python's
    multiprocessing resource trackers, which then release the shared memory and
    semaphores the others registered (and exit); they are killed too if they linger.
    A SIGTERM instead makes vLLM 0.32's engine core print start-up failure tracebacks
    (or, in the API server, wait for an engine that never comes)."""
    trackers = set()
    for pid, cmdline in _group_members(pgid).items():
        if "multiprocessing.resource_tracker" in cmdline:
            trackers.add(pid)
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + tracker_wait_s
    while trackers and time.monotonic() < deadline:
        trackers = {pid for pid in trackers if _alive(pid)}
        time.sleep(0.05)
    _signal_group(pgid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] not in ("Z", "X")
    except OSError:
        return False


def supervise(argv: list[str], server: list[str] | None = None, grace_s: float = GRACE_S) -> int:
    """Run ``serve argv`` in a child session until it exits; return its exit code, or the
    interrupted status (128 + signal: 130, 143) when it was stopped before it served.

    ``server`` is the command the arguments are appended to (default: the plugin's
    server process module); tests pass a stand-in.
    """
    stops = _Stops(grace_s)
    proc: subprocess.Popen | None = None
    report_r, report_w = os.pipe()
    os.set_blocking(report_r, False)

    def stop(signum: int) -> None:
        if stops.serving:
            proc.send_signal(signal.SIGTERM)
            _say(f"stopping: in-flight requests may finish for up to {stops.drain_s:.0f} s "
                 "(--shutdown-timeout); interrupt again to kill the server now")
            return
        # Nothing is served yet: stop every process of the server (API server, engine
        # core, workers) at once; vLLM 0.32's start-up does not stop on one SIGTERM.
        stops.stopped_starting = True
        _say(f"interrupted ({signal.Signals(signum).name}) while {STARTING[stops.progress]}: "
             "nothing is served yet; stopping the server")
        _kill_starting_server(proc.pid)

    def on_signal(signum, frame) -> None:  # recorded only: the loop below acts on it
        stops.times.append(time.monotonic())
        stops.signals.append(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    handled = False
    try:
        server = server or [sys.executable, "-m", SERVER_MODULE]
        proc = subprocess.Popen([*server, *argv], start_new_session=True,
                                preexec_fn=_die_with_parent, pass_fds=(report_w,),
                                env={**os.environ, REPORT_FD_ENV: str(report_w)})
        os.close(report_w)
        while True:
            stops.read_report(report_r)
            if stops.times and not handled and proc.poll() is None:
                handled = True
                stop(stops.signals[0])
            try:
                code = _exit_code(proc.wait(timeout=0.1))
                break
            except subprocess.TimeoutExpired:
                pass
            why = stops.overdue(time.monotonic())
            if why:
                _say(f"{why}: killing the server (process group {proc.pid})")
                _signal_group(proc.pid, signal.SIGKILL)
                code = _exit_code(proc.wait())
                break
        if stops.stopped_starting:
            _signal_group(proc.pid, signal.SIGKILL)  # no engine process outlives it
            _say("stopped before it served (any resource_tracker 'leaked shared_memory/"
                 "semaphore objects' lines above are Python releasing what the stopped "
                 "processes had created)")
            return 128 + stops.signals[0]
        return code
    finally:
        os.close(report_r)
        for s, handler in previous.items():
            signal.signal(s, handler)


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode
