"""The explain tool reports what the engine's gate decides."""

from __future__ import annotations

import json

import pytest

from vllm_ascend_ext.tools.split_gate import local_heads, main


def _run(capsys, *argv):
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_regressing_family_after_tp_sharding(capsys):
    out = _run(capsys, "--soc", "ascend950", "--head-dim", "256", "--q-heads", "24",
               "--kv-heads", "4", "--tp", "8")
    assert out.startswith("single call: regressing shape: head_dim 256 with 3 local q heads")


def test_json_output(capsys):
    res = json.loads(_run(capsys, "--soc", "950", "--head-dim", "128", "--q-heads", "64",
                          "--kv-heads", "4", "--tp", "8", "--json"))
    assert res == {"split": True, "reason": "auto", "soc": "ascend950", "family": "A5",
                   "local_q_heads": 8, "local_kv_heads": 1, "head_dim": 128, "mode": "auto"}


@pytest.mark.parametrize("argv,expected", [
    (["--soc", "a2"], "single call: soc A2 not in A5"),
    (["--soc", "a2", "--mode", "on"], "split: mixed_split=on"),
    (["--soc", "950", "--prefill-tokens", "0"], "single call: not mixed"),
    (["--soc", "a2", "--batch-invariant"], "split: batch invariance"),
])
def test_modes_and_overrides(capsys, argv, expected):
    out = _run(capsys, *argv, "--head-dim", "128", "--q-heads", "32", "--kv-heads", "8")
    assert out.startswith(expected)


def test_bad_arguments_are_named(capsys):
    with pytest.raises(SystemExit):
        main(["--soc", "ascend999", "--head-dim", "128", "--q-heads", "8", "--kv-heads", "8"])
    assert "unknown Ascend SoC 'ascend999'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="not divisible by --tp 3"):
        local_heads(64, 4, 3)
    assert local_heads(32, 4, 8) == (4, 1)  # KV heads replicate below the TP degree
