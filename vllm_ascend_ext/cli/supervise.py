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
- the exit code is the server's (0 after an orderly stop); a server that ends without a
  stop request because a process of it died (vLLM 0.32's server then exits 0) exits 1
  (or the server's own non-zero status), with one line naming that process and its
  signal or status: the server reports each of its children that ends abnormally.

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
    import threading

    threading.Thread(target=watch_children, args=(report,), name="ascend_ext-child-watch",
                     daemon=True).start()
    if health is None:
        report.send("ready")
        return
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


def _children(pid: int) -> list[int]:
    """Child pids of ``pid`` (Linux: every thread's ``children`` list)."""
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    return out


def _process_title(pid: int) -> str | None:
    """A process's title (vLLM names its processes, e.g. ``VLLM::EngineCore``)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().split(b"\0")
        return words[0].decode(errors="replace") or None
    except OSError:
        return None


def death_of(code: int, status: int) -> str | None:
    """How a child ended, from ``waitid``'s ``si_code``/``si_status``: ``signal:NAME``,
    ``exit:N``, or None for a clean exit (status 0)."""
    if code in (os.CLD_KILLED, os.CLD_DUMPED):
        try:
            return f"signal:{signal.Signals(status).name}"
        except ValueError:
            return f"signal:{status}"
    if code == os.CLD_EXITED and status != 0:
        return f"exit:{status}"
    return None


def _death_of_returncode(returncode: int) -> str | None:
    """``death_of`` for a Popen-style returncode (negative: the signal)."""
    return (death_of(os.CLD_KILLED, -returncode) if returncode < 0
            else death_of(os.CLD_EXITED, returncode))


def _process_object(pid: int):
    """The ``multiprocessing`` process object that started child ``pid``, if any (vLLM
    starts its engine core so; its owner's reaping records the returncode there)."""
    import gc
    import multiprocessing.process as mp_process

    for obj in gc.get_objects():
        if (isinstance(obj, mp_process.BaseProcess)
                and getattr(getattr(obj, "_popen", None), "pid", None) == pid):
            return obj
    return None


def _reaped_status(proc, wait_s: float = 2.0) -> str:
    """How a child that its owner reaped first ended, from its process object's
    returncode (None for a clean exit); ``unknown`` without one."""
    deadline = time.monotonic() + wait_s
    while proc is not None and time.monotonic() < deadline:
        code = proc._popen.returncode
        if code is not None:
            return _death_of_returncode(code)
        time.sleep(0.02)
    return "unknown"


def watch_children(report: ServerReport, period_s: float = 0.1) -> None:
    """In the server process: report ``died <pid> <how> <title>`` for each child (the
    engine core; with one device it also runs the worker) that ends by a signal or a
    non-zero status. Each child gets a thread blocked in ``waitid(WNOWAIT)`` on its pidfd:
    the kernel completes that wait the moment the child ends and reads its status without
    reaping it, before vLLM's own monitor (woken too, but in Python) gets to reap it.
    Titles are read while the children live (a dead process has none)."""
    import threading

    titles: dict[int, str] = {}

    def wait_for(pid: int, fd: int) -> None:
        proc, how = None, None
        try:
            proc = _process_object(pid)    # held while the child lives
            info = os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOWAIT)
            how = death_of(info.si_code, info.si_status) if info else None
        except ChildProcessError:      # reaped by its owner first: its record says how
            # (a child that is no multiprocessing process, e.g. a subprocess.run helper
            # the server waited for itself, is not reported)
            how = _reaped_status(proc) if proc is not None else None
        finally:
            os.close(fd)
        try:
            if how:
                title = titles.get(pid) or "?"
                report.send(f"died {pid} {how} {title.replace(' ', '_')}")
        finally:
            done.add(pid)

    if not hasattr(os, "P_PIDFD"):
        return
    done: set[int] = set()             # pids whose wait ended (forgotten once gone)
    while report.fd is not None:
        children = _children(os.getpid())
        for pid in [p for p in done if p not in children]:
            done.discard(pid)
            titles.pop(pid, None)
        for pid in children:
            title = _process_title(pid)
            if pid in titles:
                titles[pid] = title or titles[pid]
                continue
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:      # ended meanwhile
                continue
            except (OSError, AttributeError):   # no pidfds (Linux < 5.3): not watched
                return
            titles[pid] = title or "?"
            threading.Thread(target=wait_for, args=(pid, fd), daemon=True,
                             name=f"ascend_ext-wait-{pid}").start()
        time.sleep(period_s)


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
        self.deaths: list[tuple[int, str, str]] = []   # (pid, how, title) of its children
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
                elif words[:1] == ["died"] and len(words) == 4 and words[1].isdigit():
                    self.deaths.append((int(words[1]), words[2], words[3]))

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
        stops.read_report(report_r)
        if not stops.times:
            failed = unrequested_end(proc.pid, proc.returncode, stops)
            if failed is not None:
                _say(failed[1])
                return failed[0]
        return code
    finally:
        os.close(report_r)
        for s, handler in previous.items():
            signal.signal(s, handler)


def _how(how: str) -> str:
    kind, _, value = how.partition(":")
    if kind == "unknown":
        return "ended (its status was reaped before it could be read)"
    return f"was killed by {value}" if kind == "signal" else f"exited with status {value}"


def unrequested_end(server_pid: int, returncode: int, stops: _Stops) -> tuple[int, str] | None:
    """(exit code, the line saying why) when the server ended without a stop request
    because a process died (vLLM 0.32's server then shuts down with status 0, so a
    restart-on-failure supervisor would never restart it); None for a plain exit code
    the server chose itself while starting (e.g. ``--help``, a bad argument)."""
    code = _exit_code(returncode)
    if returncode < 0:
        return code, f"the server process (pid {server_pid}) {_how(_death_of_returncode(returncode))}"
    if stops.deaths:
        known = [d for d in stops.deaths if d[1] != "unknown"]
        pid, how, title = (known or stops.deaths)[0]
        return (code or 1), (f"the server stopped because its process {title} (pid {pid}) "
                             f"{_how(how)}; exiting with status {code or 1}")
    if stops.serving and code == 0:
        return 1, ("the server stopped by itself while serving (no stop was requested): "
                   "its engine ended (see the log above); exiting with status 1")
    return None


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode
