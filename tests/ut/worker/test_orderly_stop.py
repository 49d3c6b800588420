"""What the plugin's worker does for an orderly stop (worker/orderly_stop.py)."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

from vllm_ascend_ext.worker.orderly_stop import log_final_summaries

CHILD = textwrap.dedent("""
    import os, signal, sys, time
    from types import SimpleNamespace
    from vllm_ascend_ext.worker.orderly_stop import leave_ctrl_c_to_engine
    took = leave_ctrl_c_to_engine(SimpleNamespace(distributed_executor_backend=sys.argv[1]))
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        survived = "survived"
    except KeyboardInterrupt:
        survived = "interrupted"
    print(took, survived, signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)
""")


@pytest.mark.parametrize("backend,expected", [
    ("mp", "True survived True"),         # a worker process of its own: its engine stops it
    ("uni", "False interrupted True"),    # the engine's own process: Ctrl-C keeps working
    (None, "False interrupted True"),
])
def test_worker_leaves_ctrl_c_to_its_engine_only_in_its_own_process(backend, expected):
    out = subprocess.run([sys.executable, "-c", CHILD, str(backend)], capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.strip() == expected, out.stderr


def test_the_ctrl_c_handler_is_not_inherited_by_programs_a_worker_runs():
    code = ("import signal, subprocess, sys; from types import SimpleNamespace; "
            "from vllm_ascend_ext.worker.orderly_stop import leave_ctrl_c_to_engine; "
            "leave_ctrl_c_to_engine(SimpleNamespace(distributed_executor_backend='mp')); "
            "print(subprocess.run(['sh', '-c', 'kill -INT $$; echo alive'], "
            "capture_output=True, text=True).returncode)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == str(-2), out.stderr  # the child died of SIGINT


def _fia_builder():
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from vllm_ascend_ext.attention.fia.builder import AscendFIAMetadataBuilder

    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float32)
    return AscendFIAMetadataBuilder(spec, ["model.layers.0.self_attn.attn"], None,
                                    torch.device("cpu"), mode="on", soc_family="A2")


def test_final_summaries_are_logged_once_per_builder(caplog):
    builders = [_fia_builder(), _fia_builder()]
    builders[0].stats.record(True, "forced on")
    runner = SimpleNamespace(attn_groups=[[SimpleNamespace(metadata_builders=builders[:1])],
                                          [SimpleNamespace(metadata_builders=builders[1:])]])
    with caplog.at_level(logging.INFO, logger="vllm.ascend_ext"):
        assert log_final_summaries(runner) == 2
        log_final_summaries(runner)  # a second shutdown call logs nothing new
        del builders, runner  # nor does garbage collection afterwards
    lines = [r.getMessage() for r in caplog.records if "mixed-split" in r.getMessage()]
    assert lines == [
        "ascend_ext mixed-split: group=model.layers.0.self_attn.attn mixed_steps=1 split=1 "
        "declined=0 (none)",
        "ascend_ext mixed-split: group=model.layers.0.self_attn.attn mixed_steps=0 split=0 "
        "declined=0 (none)",
    ]


def test_a_runner_without_attention_groups_is_fine():
    assert log_final_summaries(None) == 0
    assert log_final_summaries(SimpleNamespace(attn_groups=[])) == 0

