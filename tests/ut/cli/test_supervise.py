"""The ``serve`` supervisor against stand-in servers (the real server: tests/e2e)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

# A stand-in server: reports its drain window like the real one (cli/vllm_commands.py),
# prints its session id and pid, then exits 0 on SIGTERM after a pause (an orderly stop),
# or ignores SIGTERM (a server that hangs in its stop).
SERVER = textwrap.dedent("""
    import os, signal, sys, time
    from vllm_ascend_ext.cli.supervise import report_shutdown_timeout
    mode, drain = sys.argv[1], float(sys.argv[2])
    def stop(signum, frame):
        print("server got", signal.Signals(signum).name, flush=True)
        time.sleep(0.3)
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop if mode == "orderly" else signal.SIG_IGN)
    signal.signal(signal.SIGINT, lambda *a: print("server got SIGINT", flush=True))
    report_shutdown_timeout(drain)
    print("server", os.getsid(0), os.getpid(), flush=True)
    if mode == "engine-dies":   # its engine process is killed; it then exits 0, as vLLM's
        import multiprocessing as mp
        engine = mp.get_context("fork").Process(target=time.sleep, args=(60,))
        engine.start()
        time.sleep(1.0)
        print("engine", engine.pid, flush=True)
        os.kill(engine.pid, signal.SIGKILL)
        engine.join()
        time.sleep(0.3)
        sys.exit(0)
    if mode == "quits":         # ends by itself, status 0, nobody asked
        time.sleep(0.5)
        sys.exit(0)
    while True:
        time.sleep(0.05)
""")

SUPERVISOR = textwrap.dedent("""
    import sys
    from vllm_ascend_ext.cli.supervise import supervise
    server = [sys.executable, "-c", sys.argv[1]]
    sys.exit(supervise(sys.argv[3:], server=server, grace_s=float(sys.argv[2])))
""")


def _start(mode: str, grace: float, drain: float = 10.0):
    proc = subprocess.Popen([sys.executable, "-c", SUPERVISOR, SERVER, str(grace), mode,
                             str(drain)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    line = proc.stdout.readline().split()
    assert line[0] == "server", line
    time.sleep(0.5)  # the supervisor reads the report within 0.2 s
    return proc, int(line[1]), int(line[2])


def _stop(proc, sig, times=1) -> tuple[int, str, str, float]:
    t0 = time.monotonic()
    for _ in range(times):
        proc.send_signal(sig)
        time.sleep(0.2)
    out, err = proc.communicate(timeout=30)
    return proc.returncode, out, err, time.monotonic() - t0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_one_signal_becomes_one_sigterm_to_the_server_in_its_own_session(sig):
    proc, sid, pid = _start("orderly", grace=5, drain=7)
    assert sid == pid != proc.pid  # the server leads its own session: Ctrl-C cannot reach it
    code, out, err, _ = _stop(proc, sig)
    assert code == 0
    assert out.strip().splitlines()[-1] == "server got SIGTERM"  # never SIGINT
    assert "may finish for up to 7 s" in err  # the window the server reported
    assert "interrupt again to kill the server now" in err


def test_second_interrupt_kills_a_server_that_does_not_stop():
    proc, _, pid = _start("stuck", grace=60)
    code, _, err, took = _stop(proc, signal.SIGINT, times=2)
    assert code == 128 + signal.SIGKILL and took < 10
    assert f"second interrupt: killing the server (process group {pid})" in err


def test_a_stop_that_outlasts_the_reported_drain_window_and_grace_is_bounded():
    proc, _, _ = _start("stuck", grace=1, drain=0.5)
    code, _, err, took = _stop(proc, signal.SIGTERM)
    assert code == 128 + signal.SIGKILL and 1.3 < took < 10
    assert "no exit within 2 s of the stop request" in err


def test_the_server_exit_code_is_passed_through():
    out = subprocess.run([sys.executable, "-c", SUPERVISOR, "import sys; sys.exit(3)", "1",
                          "x"], capture_output=True, timeout=30)
    assert out.returncode == 3


def test_a_dead_engine_process_fails_the_server_naming_it_and_its_signal():
    proc, _, _ = _start("engine-dies", grace=5)
    engine = int(proc.stdout.readline().split()[1])
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1, err
    assert (f"the server stopped because its process {sys.executable} (pid {engine}) was "
            "killed by SIGKILL; exiting with status 1") in err


def test_a_server_that_ends_by_itself_while_serving_fails():
    proc, _, _ = _start("quits", grace=5)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert "stopped by itself while serving (no stop was requested)" in err


def test_a_killed_server_process_is_named():
    from vllm_ascend_ext.cli.supervise import _Stops, death_of, unrequested_end

    stops = _Stops(1.0)
    assert unrequested_end(42, -9, stops) == (
        137, "the server process (pid 42) was killed by SIGKILL")
    assert unrequested_end(42, 3, stops) is None       # its own status, while starting
    assert unrequested_end(42, 0, stops) is None       # e.g. --help
    assert death_of(os.CLD_KILLED, 9) == "signal:SIGKILL"
    assert death_of(os.CLD_EXITED, 2) == "exit:2" and death_of(os.CLD_EXITED, 0) is None


def test_without_a_supervisor_the_report_is_a_no_op(monkeypatch):
    from vllm_ascend_ext.cli.supervise import REPORT_FD_ENV, report_shutdown_timeout

    monkeypatch.delenv(REPORT_FD_ENV, raising=False)
    report_shutdown_timeout(10)  # nothing to write to, nothing raised
    monkeypatch.setenv(REPORT_FD_ENV, "987654")  # a descriptor that is not open
    report_shutdown_timeout(10)


# A stand-in for a server still starting: reports its drain window with a health URL
# nobody answers (so never "ready"), or reports nothing at all (still importing); it
# ignores SIGTERM as vLLM 0.32's API server does while it waits for its engine.
STARTING = textwrap.dedent("""
    import os, signal, sys, time
    from vllm_ascend_ext.cli.supervise import report_shutdown_timeout
    mode = sys.argv[1]
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode == "engine":
        from vllm_ascend_ext.cli.supervise import HealthTarget
        report_shutdown_timeout(10, HealthTarget("127.0.0.1", 9))  # discard port: never up
    print("server", os.getsid(0), os.getpid(), flush=True)
    while True:
        time.sleep(0.05)
""")


@pytest.mark.parametrize("phase,sig,said", [
    ("engine", signal.SIGINT, "while starting the engine (loading the model"),
    ("import", signal.SIGTERM, "while starting the server process (importing vLLM"),
])
def test_a_stop_while_starting_ends_within_seconds_with_the_interrupted_status(phase, sig, said):
    proc = subprocess.Popen([sys.executable, "-c", SUPERVISOR, STARTING, "60", phase],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().split()[0] == "server"
    time.sleep(0.5)
    code, _, err, took = _stop(proc, sig)
    assert code == 128 + sig and took < 5, (code, took, err)
    assert f"interrupted ({signal.Signals(sig).name}) {said}" in err
    assert "nothing is served yet" in err and "in-flight requests" not in err
    assert "stopped before it served" in err and "Traceback" not in err


def test_health_target_probes_loopback_for_wildcard_hosts():
    from argparse import Namespace

    from vllm_ascend_ext.cli.supervise import HealthTarget
    from vllm_ascend_ext.cli.vllm_commands import health_target

    def target(**kw):
        base = dict(uds=None, host=None, port=8000, ssl_certfile=None, ssl_cert_reqs=0,
                    headless=False, grpc=False)
        return health_target(Namespace(**{**base, **kw}))

    assert target() == HealthTarget("127.0.0.1", 8000)
    assert target(host="0.0.0.0", port=9) == HealthTarget("127.0.0.1", 9)
    assert target(host="::") == HealthTarget("::1", 8000)
    assert target(host="10.1.2.3", ssl_certfile="c.pem") == HealthTarget("10.1.2.3", 8000, True)
    assert target(uds="/tmp/s.sock") == HealthTarget(unix_path="/tmp/s.sock")
    # no HTTP server, or client certificates required: cannot be probed (counts as serving)
    assert target(headless=True) is None and target(grpc=True) is None
    assert target(ssl_certfile="c.pem", ssl_cert_reqs=2) is None


def _health_server(family_kw):
    import http.server
    import socketserver
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *a):
            pass

    if "unix_path" in family_kw:
        class Server(socketserver.UnixStreamServer):
            def get_request(self):
                conn, _ = super().get_request()
                return conn, ("local", 0)
        srv = Server(family_kw["unix_path"], Handler)
    else:
        srv = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def test_the_health_probe_ignores_proxies_and_reaches_unix_sockets(monkeypatch, tmp_path):
    from vllm_ascend_ext.cli.supervise import HealthTarget, health_ok

    monkeypatch.setenv("http_proxy", "http://proxy.invalid:3128")   # never used
    srv = _health_server({})
    try:
        assert health_ok(HealthTarget("127.0.0.1", srv.server_address[1]))
    finally:
        srv.shutdown()
    assert not health_ok(HealthTarget("127.0.0.1", srv.server_address[1]), timeout_s=0.5)
    sock = str(tmp_path / "s.sock")
    usrv = _health_server({"unix_path": sock})
    try:
        assert health_ok(HealthTarget(unix_path=sock))
    finally:
        usrv.shutdown()
