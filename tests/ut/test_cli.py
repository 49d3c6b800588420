"""``python -m vllm_ascend_ext``: argument handling (the server itself: tests/e2e/test_serve.py)."""

from __future__ import annotations

import sys

import pytest

from vllm_ascend_ext import cli
from vllm_ascend_ext.models import tiny_model_path


@pytest.fixture
def captured(monkeypatch):
    seen = {}
    import vllm.entrypoints.launchers.api_server.entry as entry

    monkeypatch.setattr(entry, "main", lambda: seen.setdefault("argv", list(sys.argv)))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    return seen


@pytest.mark.parametrize("argv,expected", [
    (["serve", "--port", "9"],
     ["--model", tiny_model_path(), "--served-model-name", "tiny-qwen3", "--port", "9"]),
    (["serve", "/models/qwen3", "--dtype", "bfloat16"],
     ["--model", "/models/qwen3", "--dtype", "bfloat16"]),
    (["serve", "--model", "/m", "--port", "9"], ["--model", "/m", "--port", "9"]),
    (["serve", "--served-model-name", "x"],
     ["--model", tiny_model_path(), "--served-model-name", "x"]),
])
def test_serve_builds_vllm_server_arguments(captured, argv, expected):
    assert cli.main(argv) == 0
    assert captured["argv"][1:] == expected


def test_other_commands(capsys):
    assert cli.main(["tiny-model-path"]) == 0
    assert capsys.readouterr().out.strip() == tiny_model_path()
    from vllm_ascend_ext.models import tiny_dsa_path

    assert cli.main(["tiny-model-path", "dsa-w8a8"]) == 0
    assert capsys.readouterr().out.strip() == tiny_dsa_path(quantized=True)
    assert cli.main(["tiny-model-path", "llama"]) == 2
    assert "qwen3, dsa, dsa-w8a8" in capsys.readouterr().err
    assert cli.main(["bogus"]) == 2
    assert "unknown command 'bogus'" in capsys.readouterr().err
    assert cli.main([]) == 2
