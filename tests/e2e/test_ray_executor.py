"""vLLM's Ray executor on the emulated Atlas engine path: a local Ray cluster started the
way one starts it on an Atlas node (``ray start --head``; here it declares two "NPU"
resources, which Ray's NPU accelerator would find itself), ``--distributed-executor-backend
ray`` with tensor parallelism, each worker a Ray actor running the plugin's NPU worker on
the CPU stand-in, their collectives through the plugin's communicator on gloo.

Ray's NPU accelerator narrows each actor to its own device (``ASCEND_RT_VISIBLE_DEVICES``)
unless told not to; vLLM's Ray executor maps ranks to physical ids itself, so the platform
tells Ray not to (``ray_noset_device_env_vars``). The stand-in sees only the devices that
variable lists, as the NPU runtime does, so the control (Ray left to narrow them) fails
the start the way an Atlas node would.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import pytest

from tests.e2e.conftest import REPO, _run, child_env, run_script
from tests.e2e.serve_checks import (
    complete,
    first_traceback,
    kill_sessions,
    server_sessions,
    tails,
    wait_healthy,
)

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("parallel")]

ray = pytest.importorskip("ray", reason="the Ray executor needs ray (the dev extra has it)")

NPUS = 2


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A one-node Ray cluster on loopback with two "NPU" resources; its address."""
    from tests.e2e.nightly.serving import free_port

    port = free_port()
    env = child_env(emulate=False, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    log = tmp_path_factory.mktemp("ray") / "ray-start.log"
    with open(log, "w") as out:
        rc = subprocess.run([*_ray_cli(), "start", "--head", "--node-ip-address", "127.0.0.1",
                             "--port", str(port), "--num-cpus", str(NPUS),
                             "--resources", f'{{"NPU": {NPUS}}}', "--disable-usage-stats",
                             "--include-dashboard", "false"],
                            env=env, stdout=out, stderr=subprocess.STDOUT, timeout=120).returncode
    try:
        assert rc == 0, log.read_text()
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([*_ray_cli(), "stop", "--force"], env=env, capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def one_engine():
    return run_script("run_dp.py", "--dp", "1", "--model", "qwen-moe", emulate=True)


def _ray_env(address: str) -> dict[str, str]:
    # RAY_DEDUP_LOGS=0: each actor's own lines reach the driver's log (the test counts them)
    return {"RAY_ADDRESS": address, "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0"}


def _ray_cli() -> list[str]:
    return [shutil.which("ray") or os.path.join(os.path.dirname(sys.executable), "ray")]


def test_ray_tp2_equals_one_engine_and_narrowed_devices_fail_the_start(ray_cluster, one_engine):
    """Tiny Qwen MoE in fp32, TP2 on the Ray executor: the same greedy tokens as one
    engine, logprobs within fp32 summation-order noise; each rank is a Ray actor running
    the NPU worker, with every stand-in device visible, on its own device index.
    Control: with Ray narrowing each actor's visible devices, rank 1 sees one device and
    the NPU worker refuses to start, naming the variable."""
    one = one_engine
    two = run_script("run_tp.py", "--tp", "2", "--executor", "ray", emulate=True,
                     **_ray_env(ray_cluster))
    assert [(r["tp_rank"], r["device_index"], r["visible_devices"]) for r in two["ranks"]] \
        == [(0, 0, None), (1, 1, None)]
    for rank in two["ranks"]:
        assert rank["worker"] == "EmulatedNPUWorker" and rank["runtime"] == "cpu-npu-stand-in"
        assert rank["tp_communicator"] == "AscendCommunicator"
    assert two["tokens"] == one["tokens"]
    assert max(abs(a - b) for la, lb in zip(one["logprobs"], two["logprobs"])
               for a, b in zip(la, lb)) < 1e-4

    env = child_env(True, **_ray_env(ray_cluster))
    rc, out, err = _run("run_tp.py", ("--tp", "2", "--executor", "ray",
                                      "--ray-narrow-visible"), env, 600)
    assert rc != 0 and "RESULT" not in out
    assert ("NPU worker rank 1 needs device 1, but 1 NPU(s) are visible "
            "(ASCEND_RT_VISIBLE_DEVICES='1')") in err, err[-4000:]


def test_ray_tp2_serves_through_the_openai_server_and_stops_cleanly(ray_cluster, one_engine,
                                                                    tmp_path):
    """``vllm serve --tensor-parallel-size 2 --distributed-executor-backend ray`` against
    the cluster: completions equal one engine's, the two ranks ran in two Ray actors (the
    NPU worker: vLLM logs its engine path from rank 0),
    the server exits 0 on SIGTERM, leaves no process behind and logs no traceback."""
    from tests.e2e.dp_prompts import MAX_TOKENS, PROMPTS
    from tests.e2e.nightly.serving import free_port
    from vllm_ascend_ext.models import tiny_qwen_moe_path

    one = one_engine
    model, port, path = tiny_qwen_moe_path(), free_port(), tmp_path / "serve.log"
    env = child_env(emulate=True, VLLM_CPU_OMP_THREADS_BIND="nobind", **_ray_env(ray_cluster))
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")     # as a user's server runs
    cmd = [sys.executable, "-m", "vllm_ascend_ext", "serve", model, "--dtype", "float32",
           "--enforce-eager", "--max-model-len", "512", "--seed", "0", "--port", str(port),
           "--tensor-parallel-size", "2", "--distributed-executor-backend", "ray"]
    sessions: set[int] = set()
    with open(path, "a") as log:
        server = subprocess.Popen(cmd, cwd=str(REPO), env=env, stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy([server], port, [path])
        sessions = server_sessions([server])
        got = [complete(port, model, p, n) for p, n in zip(PROMPTS, MAX_TOKENS)]
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=120)
    finally:
        sessions |= server_sessions([server])
        if server.poll() is None:
            server.kill()
            server.wait(timeout=60)
        left = kill_sessions(sessions)
    assert [g["tokens"] for g in got] == one["tokens"]
    assert max(abs(a - b) for g, ref in zip(got, one["logprobs"])
               for a, b in zip(g["logprobs"], ref)) < 1e-4
    assert code == 0, tails([path])
    assert not left, left
    text = path.read_text(errors="replace")
    lines = text.splitlines()
    ranks = {(line.split("RayWorkerProc pid=", 1)[1].split(")", 1)[0],
              line.split(" rank=", 1)[1].split()[0])
             for line in lines if "RayWorkerProc pid=" in line and "world_size=2 rank=" in line}
    assert sorted(r for _, r in ranks) == ["0", "1"] and len({p for p, _ in ranks}) == 2, ranks
    assert any("RayWorkerProc pid=" in line and "worker EmulatedNPUWorker" in line
               for line in lines), tails([path])
    assert not first_traceback(path), first_traceback(path)
