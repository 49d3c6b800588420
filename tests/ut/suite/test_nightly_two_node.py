"""The nightly's two-node recipe: which model it serves (and why it skips), the commands
of both nodes, and its throughput gate."""

from __future__ import annotations

import pytest

from tests.e2e.nightly.models import two_node_model
from tests.e2e.nightly.two_node import TwoNodes, throughput_gate


def test_the_dry_run_serves_the_tiny_w8a8_model_as_dp2_with_ep():
    m = two_node_model(0, dry=True)
    assert m.skip is None and m.name == "tiny-dsa-w8a8-2node" and "tiny_dsa_w8a8" in m.path
    args = " ".join(m.serve_args)
    assert "--data-parallel-size 2 --data-parallel-size-local 1" in args
    assert "--enable-expert-parallel" in args and "--dtype float32" in args


@pytest.mark.parametrize("env,needle", [
    ({}, "NIGHTLY_DSA_W8A8_2NODE is not set"),
    ({"NIGHTLY_DSA_W8A8_2NODE": "/nonexistent/dsv32"}, "is not a directory"),
    ({"NIGHTLY_DSA_W8A8_2NODE": "."}, "NIGHTLY_NODE1_LAUNCH"),
    ({"NIGHTLY_DSA_W8A8_2NODE": ".", "NIGHTLY_NODE1_LAUNCH": "ssh b",
      "NIGHTLY_NODE0_ADDRESS": "10.0.0.1"}, "needs 8 NPUs per node, this runner has 4"),
])
def test_a_real_run_skips_saying_what_is_missing(env, needle):
    assert needle in two_node_model(4, dry=False, environ=env).skip


def test_a_real_run_serves_tp8_per_node_and_launches_node1_through_the_prefix(tmp_path):
    env = {"NIGHTLY_DSA_W8A8_2NODE": str(tmp_path), "NIGHTLY_NODE1_LAUNCH":
           "ssh -tt atlas-b 'cd /srv/x' &&", "NIGHTLY_NODE0_ADDRESS": "10.0.0.1",
           "NIGHTLY_DSA_W8A8_2NODE_GSM8K_MIN": "0.93"}
    m = two_node_model(8, dry=False, environ=env)
    assert m.skip is None and m.gsm8k_floor == 0.93
    assert "--tensor-parallel-size 8" in " ".join(m.serve_args)
    nodes = TwoNodes(m, tmp_path, dry=False, environ=env)
    cmd = nodes.node1_command()
    assert cmd[:4] == ["ssh", "-tt", "atlas-b", "cd /srv/x"] and cmd[4] == "&&"
    assert cmd[5:8] == ["python", "-m", "vllm_ascend_ext"]
    line = " ".join(cmd)
    assert "--data-parallel-address 10.0.0.1" in line and line.endswith(
        "--headless --data-parallel-start-rank 1")
    api = " ".join(nodes.api.command())
    assert "--data-parallel-address 10.0.0.1" in api and "--headless" not in api
    rpc = lambda c: c.split("--data-parallel-rpc-port ")[1].split()[0]   # noqa: E731
    assert rpc(api) == rpc(line)


RUNS = [{"output_throughput": x} for x in (90.0, 120.0, 100.0)]


@pytest.mark.parametrize("env,ok,needle", [
    ({}, False, "NIGHTLY_DSA_W8A8_2NODE_MIN_TPS is not set"),
    ({"NIGHTLY_DSA_W8A8_2NODE_MIN_TPS": "100"}, True, "100.0 tok/s over 3 runs >= floor 100.0"),
    ({"NIGHTLY_DSA_W8A8_2NODE_MIN_TPS": "101"}, False, "< floor 101.0"),
])
def test_the_throughput_gate_holds_the_median_to_the_floor(env, ok, needle):
    got_ok, detail = throughput_gate(RUNS, env, dry=False)
    assert got_ok is ok and needle in detail


def test_the_dry_run_reports_throughput_without_gating_it():
    ok, detail = throughput_gate(RUNS, {}, dry=True)
    assert ok and "reported, not gated" in detail and "100.0" in detail
