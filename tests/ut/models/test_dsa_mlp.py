"""The plugin's DeepSeek MoE block (models/dsa_mlp.DsaMoE) against vLLM's DeepseekV2MoE:
the same parameters and, with the same weights, the same output (float weights: the
shared expert takes vLLM's forward); one changed shared-expert weight changes it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).with_name("dsa_moe_probe.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _probe() -> dict:
    env = dict(os.environ, ASCEND_EXT_EMULATE="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(Path(__file__).parents[3]))
    proc = subprocess.run([sys.executable, str(PROBE), str(_free_port())], env=env,
                          capture_output=True, text=True, timeout=240, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise AssertionError(proc.stderr[-3000:])


@pytest.mark.xdist_group("dsa_moe_probe")
def test_dsa_moe_equals_vllms_deepseek_moe_block():
    same = _probe()
    assert same["parameters_equal"]
    assert {"gate.weight", "gate.e_score_correction_bias", "shared_experts.gate_up_proj.weight",
            "shared_experts.down_proj.weight"} <= set(same["parameters"])
    assert same["outputs_equal"] and same["max_abs"] > 0.1
    assert not same["perturbed_equal"]
