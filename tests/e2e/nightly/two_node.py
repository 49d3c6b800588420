"""The nightly's two-node recipe: one model served as DP2 over two nodes the way vLLM
documents multi-node data parallelism (node 1 ``--headless``, node 0 the API server and
DP rank 0, both pointing at node 0's address), with expert parallelism over both.

On an Atlas 800 this runner is node 0 and ``NIGHTLY_NODE1_LAUNCH`` is the command prefix
that runs a command on node 1 in the same checkout and environment, in the foreground,
passing SIGTERM on (for example ``ssh -tt atlas-b cd /srv/vllm-ascend-ext &&``). In the
dry run both nodes are local processes over loopback.

Gates: the nodes serve greedy completions (finite logprobs); in the dry run these equal
one engine's (the tiny DSA W8A8 the tiny stage served alone); GSM8K at the model's floor
(real checkpoint); the median output throughput of ``bench serve`` at least
``NIGHTLY_DSA_W8A8_2NODE_MIN_TPS`` tokens/s (real checkpoint; reported in the dry run);
both nodes exit 0 on SIGTERM, the API node first.
"""

from __future__ import annotations

import os
import shlex
import signal
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from tests.e2e.nightly.models import TWO_NODE_VAR, ServedModel
from tests.e2e.nightly.serving import Server, free_port

STOP_TIMEOUT = 120


class TwoNodes:
    """``with TwoNodes(model, logs, dry=...) as api:`` -- node 1 started, then node 0 (a
    :class:`Server`, ready when entered); on exit node 0 stops first, then node 1.
    ``exit_codes`` holds both exit statuses afterwards."""

    def __init__(self, model: ServedModel, logs: Path, *, dry: bool,
                 environ: dict[str, str] | None = None):
        env = os.environ if environ is None else environ
        self.dry = dry
        self.address = "127.0.0.1" if dry else env["NIGHTLY_NODE0_ADDRESS"]
        self.launch = [] if dry else shlex.split(env["NIGHTLY_NODE1_LAUNCH"])
        self.python = sys.executable if dry else env.get("NIGHTLY_NODE1_PYTHON", "python")
        rpc = str(free_port())
        dp = ("--data-parallel-address", self.address, "--data-parallel-rpc-port", rpc)
        self.model = replace(model, serve_args=model.serve_args + dp)
        self.api = Server(self.model, "default", logs / f"{model.name}-node0.log",
                          emulate=dry)
        self.node1_log = logs / f"{model.name}-node1.log"
        self.node1: subprocess.Popen | None = None
        self.exit_codes: list[int | None] = [None, None]

    def node1_command(self) -> list[str]:
        return [*self.launch, self.python, "-m", "vllm_ascend_ext", "serve", self.model.path,
                "--seed", "0", *self.model.serve_args, "--headless",
                "--data-parallel-start-rank", "1"]

    def __enter__(self) -> Server:
        self.node1_log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.node1_log, "w") as out:
            out.write(" ".join(self.node1_command()) + "\n")
            out.flush()
            self.node1 = subprocess.Popen(self.node1_command(), env=self.api.env, stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return self.api.__enter__()
        except BaseException:
            self._stop_node1()
            raise

    def __exit__(self, *exc) -> None:
        try:
            self.api.__exit__(*exc)
        finally:
            self.exit_codes[0] = self.api.proc.returncode if self.api.proc else None
            self.exit_codes[1] = self._stop_node1()

    def _stop_node1(self) -> int | None:
        if self.node1 is None:
            return None
        if self.node1.poll() is None:
            self.node1.send_signal(signal.SIGTERM)
            try:
                self.node1.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(self.node1.pid, signal.SIGKILL)
                self.node1.wait()
        return self.node1.returncode


def throughput_gate(runs: list[dict], environ: dict[str, str] | None = None, *,
                    dry: bool) -> tuple[bool, str]:
    """(ok, detail) of the median output throughput against ``<VAR>_MIN_TPS``: reported
    only in the dry run; a real run without the floor fails (a night without its speed
    check is not a pass)."""
    env = os.environ if environ is None else environ
    median = statistics.median(r["output_throughput"] for r in runs) if runs else 0.0
    figure = f"median output throughput {median:.1f} tok/s over {len(runs)} runs"
    if dry:
        return True, f"{figure} (dry run: reported, not gated)"
    floor = env.get(f"{TWO_NODE_VAR}_MIN_TPS")
    if not floor:
        return False, f"{figure}; {TWO_NODE_VAR}_MIN_TPS is not set (the floor to hold)"
    ok = median >= float(floor)
    return ok, f"{figure} {'>=' if ok else '<'} floor {float(floor):.1f}"
