"""Plugin errors through the CLI: one line, first and whole, no traceback, exit 2.

(The misspelt-key case runs as a README command: tests/e2e/test_readme_commands.py.)
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.e2e.conftest import REPO, child_env
from vllm_ascend_ext.models import tiny_model_path

pytestmark = pytest.mark.e2e


def _serve(**env: str) -> tuple[int, list[str]]:
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_ascend_ext", "serve", tiny_model_path(), "--port", "0"],
        cwd=str(REPO), env=child_env(emulate=True, **env), capture_output=True, text=True,
        timeout=300)
    return proc.returncode, (proc.stdout + proc.stderr).splitlines()


@pytest.mark.parametrize("env,line", [
    ({"ASCEND_EXT_SOC": "ascend999"},
     "error: ASCEND_EXT_SOC='ascend999': unknown Ascend SoC 'ascend999'; did you mean "),
    ({"ASCEND_EXT_EMULATE": "maybe"},
     "error: ASCEND_EXT_EMULATE='maybe': expected one of 1, true, yes, on, 0, false, no, off"),
])
def test_environment_errors_are_one_line_with_exit_2(env, line):
    code, lines = _serve(**env)
    assert code == 2, lines[-20:]
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(line), lines[-20:]
    assert lines[-1] == errors[0]
    assert not [ln for ln in lines if "Traceback" in ln or "ValidationError" in ln]
