"""The e2e engine-result cache (``tests/e2e/engine_cache.py``) and the server start-up
wait (``tests/e2e/serve_checks.wait_healthy``), without an engine."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from tests.e2e import engine_cache as ec
from tests.e2e.serve_checks import wait_healthy


def test_the_key_ignores_what_pytest_sets_per_worker_and_nothing_else():
    env = {"ASCEND_EXT_EMULATE": "1", "PYTEST_XDIST_WORKER": "gw0", "E2E_ENGINE_CACHE": "/a"}
    same = {**env, "PYTEST_XDIST_WORKER": "gw1", "PYTEST_CURRENT_TEST": "x", "E2E_ENGINE_CACHE": "/b"}
    assert ec.key("run_llm.py", ("--a",), env) == ec.key("run_llm.py", ("--a",), same)
    assert ec.key("run_llm.py", ("--a",), env) != ec.key("run_llm.py", ("--b",), env)
    assert ec.key("run_llm.py", ("--a",), env) != ec.key("run_dsa.py", ("--a",), env)
    assert ec.key("run_llm.py", ("--a",), env) != ec.key(
        "run_llm.py", ("--a",), {**env, "ASCEND_EXT_SOC": "ascend950"})


def test_a_second_asker_waits_for_the_first_and_reads_its_result(tmp_path, monkeypatch):
    monkeypatch.setenv(ec.ENV, str(tmp_path))
    computed, seen = [], {}
    first_in = threading.Event()

    def ask(name: str, cache: ec.EngineCache) -> None:
        def compute() -> dict:
            first_in.set()
            time.sleep(0.3)
            computed.append(name)
            return {"by": name}

        seen[name] = cache.get_or_compute("k", False, compute)

    a = threading.Thread(target=ask, args=("a", ec.EngineCache()))
    a.start()
    first_in.wait(5)
    ask("b", ec.EngineCache())          # another worker's cache: only the folder is shared
    a.join()
    assert computed == ["a"] and seen == {"a": {"by": "a"}, "b": {"by": "a"}}
    assert ec.EngineCache().get("k") == {"by": "a"}
    again = ec.EngineCache().get_or_compute("k", True, lambda: {"by": "fresh"})
    assert again == {"by": "fresh"}                              # fresh: computed again

    def fails() -> dict:
        raise RuntimeError("no RESULT")

    with pytest.raises(RuntimeError):
        ec.EngineCache().get_or_compute("other", False, fails)
    assert ec.EngineCache().get("other") is None                 # a failure stores nothing


def test_engine_starts_are_counted_from_vllms_line(tmp_path, monkeypatch):
    monkeypatch.setenv(ec.ENV, str(tmp_path))
    line = f"INFO [core.py:402] {ec.ENGINE_LINE} 2.79 s\n"
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/e2e/test_a.py::test_x (call)")
    ec.EngineCache().count_starts("run_dp.py", line * 2 + "other\n")
    ec.EngineCache().count_starts("run_llm.py", line)
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/e2e/test_b.py::test_y (setup)")
    ec.EngineCache().count_starts("run_llm.py", line)
    ec.EngineCache().count_starts("run_llm.py", "no engine\n")
    assert ec.read_starts(tmp_path) == {"run_dp.py": 2, "run_llm.py": 2}
    assert ec.read_starts(tmp_path, by=0) == {"tests/e2e/test_a.py": 3, "tests/e2e/test_b.py": 1}


def _sleeper():
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])


def test_a_start_without_progress_fails_on_its_log_not_on_a_clock(tmp_path):
    log = tmp_path / "serve.log"
    log.write_text("starting\n")
    proc = _sleeper()
    try:
        def grow():
            for _ in range(6):
                time.sleep(0.2)
                with log.open("a") as f:
                    f.write(".")

        writer = threading.Thread(target=grow)
        writer.start()
        began = time.monotonic()
        with pytest.raises(AssertionError, match="no start-up progress for 0.6 s"):
            wait_healthy([proc], 1, [log], stall_s=0.6, cap_s=60)
        writer.join()
        assert time.monotonic() - began > 1.5      # the growing log kept it waiting
        with pytest.raises(AssertionError, match="not ready after 0.5 s"):
            wait_healthy([proc], 1, [log], stall_s=60, cap_s=0.5)
    finally:
        proc.kill()
        proc.wait()
    with pytest.raises(AssertionError, match="a server process exited"):
        wait_healthy([proc], 1, [log])
