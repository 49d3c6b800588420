"""The serving tests' traceback check (tests/e2e/serve_checks.py): vLLM 0.32's own
graceful-stop race is let through, and nothing else is."""

from __future__ import annotations

from tests.e2e.serve_checks import first_traceback

API = "(APIServer pid=7)"
BENIGN = [
    f"{API} INFO [launcher.py:254] [shutdown] API server: shutdown triggered",
    f"{API} ERROR [async_llm.py:700] AsyncLLM output_handler failed.",
    f"{API} Traceback (most recent call last):",
    f'{API}   File "vllm/v1/engine/async_llm.py", line 690, in output_handler',
    f"{API} vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
]


def _log(tmp_path, lines):
    path = tmp_path / "node.log"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_graceful_stop_race_is_not_a_failure(tmp_path):
    assert first_traceback(_log(tmp_path, ["(EngineCore pid=8) INFO ready", *BENIGN])) == ""


def test_the_same_traceback_before_the_stop_is_a_failure(tmp_path):
    lines = [line for line in BENIGN if "[shutdown]" not in line]
    assert "EngineDeadError" in first_traceback(_log(tmp_path, lines))


def test_another_process_stopping_does_not_excuse_it(tmp_path):
    lines = [BENIGN[0].replace(API, "(EngineCore pid=8)"), *BENIGN[1:]]
    assert "Traceback" in first_traceback(_log(tmp_path, lines))


def test_any_other_traceback_is_a_failure(tmp_path):
    other = ["\x1b[36m(RayWorkerProc pid=9)\x1b[0m Traceback (most recent call last):",
             "\x1b[36m(RayWorkerProc pid=9)\x1b[0m RuntimeError: boom"]
    found = first_traceback(_log(tmp_path, [*BENIGN, *other]))
    assert "RuntimeError: boom" in found
    plain = [*BENIGN[:1], f"{API} Traceback (most recent call last):", f"{API} KeyError: 'x'"]
    assert "KeyError" in first_traceback(_log(tmp_path, plain))
