"""The e2e runs' zygote (zygote.py): each forked run sees the zygote's import-only state,
its own environment and arguments, and fails or times out alone."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.e2e.conftest import REPO, run_script

pytestmark = pytest.mark.e2e


@pytest.mark.skipif(os.environ.get("E2E_ZYGOTE", "1") == "0", reason="zygote disabled")
def test_forked_runs_start_clean_with_their_own_environment_and_arguments():
    first = run_script("zygote_probe.py", "--sleep", "0", emulate=True, fresh=True, ZYGOTE_PROBE="a")
    second = run_script("zygote_probe.py", emulate=True, fresh=True)
    assert first["seen"] is None and second["seen"] is None      # no state passed on
    assert first["pid"] != second["pid"]
    assert (first["probe_env"], second["probe_env"]) == ("a", None)
    assert first["argv"] == ["--sleep", "0"] and first["cwd"] == str(REPO / "tests")


def test_a_failing_run_reports_its_exit_status_and_output():
    with pytest.raises(AssertionError, match=r"(?s)produced no RESULT \(rc=3\).*failing on "
                                             r"purpose"):
        run_script("zygote_probe.py", "--exit", "3", emulate=True, fresh=True, ZYGOTE_PROBE="x")
    ok = run_script("zygote_probe.py", emulate=True, fresh=True)             # the zygote lives on
    assert ok["platform"] == "probe"


def test_a_run_past_its_timeout_is_killed_alone():
    with pytest.raises(subprocess.TimeoutExpired):
        run_script("zygote_probe.py", "--sleep", "60", emulate=True, fresh=True, timeout=2)
    assert run_script("zygote_probe.py", emulate=True, fresh=True)["seen"] is None


def test_a_zygote_with_a_thread_refuses_to_fork_and_the_run_falls_back(tmp_path):
    from tests.e2e import zygote
    from tests.e2e.conftest import child_env

    env = child_env(True, E2E_ZYGOTE_TEST_THREAD="1")
    z = zygote.Zygote(env, str(REPO / "tests"))
    try:
        with pytest.raises(zygote.ZygoteRefused, match="has threads"):
            z.run(str(REPO / "tests/e2e/zygote_probe.py"), [], env, str(REPO / "tests"),
                  str(tmp_path / "out"), str(tmp_path / "err"), 60)
    finally:
        z.close()
