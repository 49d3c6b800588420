"""The ``serve`` supervisor against stand-in servers (the real server: tests/e2e)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest

from vllm_ascend_ext.cli.supervise import shutdown_timeout

# A stand-in server: prints its session id and pid, then exits 0 on SIGTERM after a
# pause (an orderly stop), or ignores SIGTERM (a server that hangs in its stop).
SERVER = textwrap.dedent("""
    import os, signal, sys, time
    mode = sys.argv[1]
    def stop(signum, frame):
        print("server got", signal.Signals(signum).name, flush=True)
        time.sleep(0.3)
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop if mode == "orderly" else signal.SIG_IGN)
    signal.signal(signal.SIGINT, lambda *a: print("server got SIGINT", flush=True))
    print("server", os.getsid(0), os.getpid(), flush=True)
    while True:
        time.sleep(0.05)
""")

SUPERVISOR = textwrap.dedent("""
    import sys
    from vllm_ascend_ext.cli.supervise import supervise
    server = [sys.executable, "-c", sys.argv[1]]
    sys.exit(supervise(sys.argv[3:], server=server, grace_s=float(sys.argv[2])))
""")


def _start(mode: str, grace: float, timeout: float = 10.0):
    proc = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR, SERVER, str(grace), mode,
         "--shutdown-timeout", str(timeout)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline().split()
    assert line[0] == "server", line
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
    proc, sid, pid = _start("orderly", grace=5)
    assert sid == pid != proc.pid  # the server leads its own session: Ctrl-C cannot reach it
    code, out, err, _ = _stop(proc, sig)
    assert code == 0
    assert out.strip().splitlines()[-1] == "server got SIGTERM"  # never SIGINT
    assert "interrupt again to kill the server now" in err


def test_second_interrupt_kills_a_server_that_does_not_stop():
    proc, _, pid = _start("stuck", grace=60)
    code, _, err, took = _stop(proc, signal.SIGINT, times=2)
    assert code == 128 + signal.SIGKILL and took < 10
    assert f"second interrupt: killing the server (process group {pid})" in err


def test_a_stop_that_outlasts_the_drain_window_and_grace_is_bounded():
    proc, _, _ = _start("stuck", grace=1, timeout=0.5)
    code, _, err, took = _stop(proc, signal.SIGTERM)
    assert code == 128 + signal.SIGKILL and 1.3 < took < 10
    assert "no exit within 2 s of the stop request" in err


def test_the_server_exit_code_is_passed_through():
    out = subprocess.run([sys.executable, "-c", SUPERVISOR, "import sys; sys.exit(3)", "1",
                          "x"], capture_output=True, timeout=30)
    assert out.returncode == 3


@pytest.mark.parametrize("argv,expected", [
    ([], 10.0), (["--shutdown-timeout", "30"], 30.0), (["--shutdown-timeout=0"], 0.0),
    (["--shutdown_timeout", "7"], 7.0), (["--shutdown-timeout", "x"], 10.0),
    (["m", "--shutdown-timeout", "3", "--shutdown-timeout", "4"], 4.0),
])
def test_shutdown_timeout_is_read_from_the_command_line(argv, expected):
    assert shutdown_timeout(argv, 10.0) == expected
