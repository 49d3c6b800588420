"""Fixtures shared by unit tests."""

from __future__ import annotations

import pytest

from vllm_ascend_ext.contract import mode
from vllm_ascend_ext.contract.harness import Harness
from vllm_ascend_ext.platform.soc import from_name


@pytest.fixture
def contract(monkeypatch):
    """Contract mode on, with a fresh harness pretending the chip asked for (an A2 until
    the test asks for another with ``contract(soc)``)."""
    monkeypatch.setenv(mode.ENV, "1")

    def use(soc: str = "ascend910b2") -> Harness:
        h = Harness(from_name(soc))
        monkeypatch.setattr(mode, "_HARNESS", [h])
        mode.install()   # what enabled() does: the harness stands in for torch_npu
        return h

    use()
    return use
