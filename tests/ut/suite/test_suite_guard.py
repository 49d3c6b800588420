"""The suite's time guard (``tests/conftest.py``): a deliberately slowed copy of the suite
fails past the limit, naming its slowest group (within the limit: the pure function)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests import conftest as guard

TESTS = Path(__file__).resolve().parents[2]


def test_over_limit_names_the_slowest_groups_first():
    by_group = {"unit tests": 50.0, "nightly": 400.0, "run_llm": 300.0}
    assert guard.over_limit(100.0, 100.0, by_group) is None
    message = guard.over_limit(101.0, 100.0, by_group)
    assert message.startswith("the suite took 101 s, over its 100 s limit")
    assert message.index("nightly 400 s") < message.index("run_llm 300 s") < message.index(
        "unit tests 50 s")


def test_only_readme_s_whole_command_is_guarded():
    assert guard.whole_suite(["tests"], "", "") and guard.whole_suite(["tests/"], "", "")
    assert not guard.whole_suite(["tests/ut"], "", "")
    assert not guard.whole_suite(["tests"], "engine", "")
    assert not guard.whole_suite(["tests"], "", "not e2e")


def _slowed_copy(root: Path) -> Path:
    (root / "tests" / "e2e").mkdir(parents=True)
    for rel in ("__init__.py", "conftest.py", "e2e/__init__.py", "e2e/conftest.py",
                "e2e/engine_cache.py"):
        shutil.copy(TESTS / rel, root / "tests" / rel)
    (root / "tests" / "test_slowed.py").write_text(
        "import time\n\ndef test_slow():\n    time.sleep(1.5)\n")
    return root


def _run(root: Path, limit: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.pop("E2E_ENGINE_CACHE", None)
    env.update(TESTS_SUITE_LIMIT_S=limit, PYTHONPATH=str(root))
    return subprocess.run([sys.executable, "-m", "pytest", "tests", "-q", "-n", "1", "-p",
                           "no:cacheprovider"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)


def test_a_slowed_copy_of_the_suite_fails_past_the_limit(tmp_path):
    root = _slowed_copy(tmp_path)
    slow = _run(root, "1")
    assert slow.returncode == 1, slow.stdout[-2000:]
    assert "1 passed" in slow.stdout
    assert "FAILED (time guard): the suite took" in slow.stdout
    assert "over its 1 s limit (TESTS_SUITE_LIMIT_S)" in slow.stdout
    assert re.search(r"slowest groups \(test seconds, both workers\): unit tests \d+ s",
                     slow.stdout), slow.stdout[-2000:]
