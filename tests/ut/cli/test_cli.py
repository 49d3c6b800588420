"""``python -m vllm_ascend_ext``: vLLM's whole CLI plus the plugin's commands.

Servers, engines and the commands README shows: tests/e2e/test_readme_commands.py;
errors through the CLI: tests/e2e/test_cli_errors.py; the supervisor: test_supervise.py.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vllm_ascend_ext.cli import entry as cli
from vllm_ascend_ext.models import tiny_dsa_path, tiny_model_path

# vLLM 0.32's subcommands, as `vllm --help` lists them (written down here, not derived).
VLLM_032_SUBCOMMANDS = {"chat", "complete", "serve", "launch", "bench", "collect-env",
                        "download-kernels", "preload", "run-batch", "snapshot"}
PLUGIN_SUBCOMMANDS = {"tiny-model-path", "doctor"}


@pytest.fixture(autouse=True)
def keep_vllm_logging(monkeypatch):
    """vLLM commands reconfigure the 'vllm' loggers (other tests capture their records),
    and ``main`` sets ``sys.argv`` for vLLM's command code."""
    import logging

    monkeypatch.setattr(sys, "argv", list(sys.argv))
    loggers = [logging.getLogger(n) for n in ("vllm", "vllm.ascend_ext")]
    saved = [(lg.handlers[:], lg.propagate, lg.level, lg.disabled) for lg in loggers]
    yield
    for lg, (handlers, propagate, level, disabled) in zip(loggers, saved):
        lg.handlers[:], lg.propagate, lg.level, lg.disabled = handlers, propagate, level, disabled


@pytest.fixture(scope="module")
def parser_and_cmds():
    return cli.build_parser([])


def _vllm_cli_command_modules() -> list[str]:
    """The CMD_MODULES list of vLLM's own CLI main, read from its source."""
    source = Path(importlib.util.find_spec("vllm.entrypoints.cli.main").origin).read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "CMD_MODULES":
            return [ast.unparse(elt) for elt in node.value.elts]
    raise AssertionError("CMD_MODULES not found in vllm/entrypoints/cli/main.py")


def test_same_command_modules_as_vllms_own_cli():
    assert list(cli.VLLM_COMMAND_MODULES) == _vllm_cli_command_modules()


def test_subcommand_set_is_vllms_plus_the_plugins(parser_and_cmds):
    _, cmds = parser_and_cmds
    assert set(cmds) == VLLM_032_SUBCOMMANDS | PLUGIN_SUBCOMMANDS
    assert not PLUGIN_SUBCOMMANDS & VLLM_032_SUBCOMMANDS


def test_each_subcommand_is_found_in_the_module_that_defines_it():
    import importlib

    defined = {}
    for module in cli.VLLM_COMMAND_MODULES:
        for cmd in importlib.import_module(module).cmd_init():
            defined[cmd.name] = module
    assert defined == cli.VLLM_SUBCOMMAND_MODULES
    # A named subcommand loads its own module only; its parser is the same.
    _, cmds = cli.build_parser(["complete", "-q", "x"])
    assert set(cmds) == {"chat", "complete"} | PLUGIN_SUBCOMMANDS


def test_vllm_subcommands_use_vllms_parsers(parser_and_cmds):
    parser, cmds = parser_and_cmds
    args = parser.parse_args(["serve", "/m", "--dtype", "float32", "--max-model-len", "512",
                              "--additional-config", '{"ascend_ext": {"mixed_split": "on"}}'])
    assert (args.model_tag, args.dtype, args.max_model_len) == ("/m", "float32", 512)
    assert args.additional_config == {"ascend_ext": {"mixed_split": "on"}}
    # The plugin's only change to serve: an orderly default drain window.
    assert args.shutdown_timeout == 10
    assert parser.parse_args(["serve", "/m", "--shutdown-timeout", "0"]).shutdown_timeout == 0
    from vllm.entrypoints.cli.openai import ChatCommand, CompleteCommand

    assert isinstance(cmds["chat"], ChatCommand) and isinstance(cmds["complete"], CompleteCommand)


def test_bench_subcommands_come_from_vllm(monkeypatch):
    argv = ["bench", "serve", "--model", "/m", "--num-prompts", "3"]
    monkeypatch.setattr(sys, "argv", ["prog", *argv])  # vLLM builds `bench` from sys.argv
    parser, _ = cli.build_parser(argv)
    args = parser.parse_args(argv)
    assert (args.subparser, args.bench_type, args.model, args.num_prompts) == (
        "bench", "serve", "/m", 3)
    bench = parser._subparsers._group_actions[0].choices["bench"]
    assert {"serve", "latency", "throughput"} <= set(bench._subparsers._group_actions[0].choices)


def test_a_plugin_command_can_never_shadow_a_vllm_one(monkeypatch):
    from vllm_ascend_ext.cli import plugin_commands

    class Shadow(plugin_commands.TinyModelPathCommand):
        name = "serve"

    monkeypatch.setattr(plugin_commands, "plugin_commands", lambda: [Shadow()])
    with pytest.raises(RuntimeError, match="'serve' would shadow a vLLM subcommand"):
        cli.build_parser([])


def test_tiny_model_path(capsys):
    assert cli.main(["tiny-model-path"]) == 0
    assert capsys.readouterr().out.strip() == tiny_model_path()
    assert cli.main(["tiny-model-path", "dsa-w8a8"]) == 0
    assert capsys.readouterr().out.strip() == tiny_dsa_path(quantized=True)
    assert cli.main(["tiny-model-path", "mimo"]) == 0
    assert capsys.readouterr().out.strip().endswith("/models/tiny_mimo")
    assert cli.main(["tiny-model-path", "qwen-moe"]) == 0
    assert capsys.readouterr().out.strip().endswith("/models/tiny_qwen_moe")
    assert cli.main(["tiny-model-path", "qwen3-next"]) == 0
    assert capsys.readouterr().out.strip().endswith("/models/tiny_qwen3_next")
    with pytest.raises(SystemExit) as info:  # argparse: usage error
        cli.main(["tiny-model-path", "llama"])
    assert info.value.code == 2
    assert "invalid choice: 'llama'" in capsys.readouterr().err


def test_snapshot_create_and_restore_are_refused_in_one_line(capsys):
    assert cli.main(["snapshot", "restore", "/nonexistent"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: snapshot restore checkpoints CUDA processes")
    assert "'snapshot inspect' works" in err and len(err.splitlines()) == 1


def test_version_is_vllms_without_distribution_metadata():
    import vllm

    out = subprocess.run([sys.executable, "-m", "vllm_ascend_ext", "--version"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == vllm.__version__


def test_plugin_errors_print_one_line_and_exit_2(monkeypatch, capsys):
    from vllm_ascend_ext.errors import AscendExtError

    def fail(argv):
        raise AscendExtError("ascend_ext.mixed_split: invalid value 'yes'")

    monkeypatch.setattr(cli, "run", fail)
    assert cli.main(["complete"]) == 2
    assert capsys.readouterr().err == "error: ascend_ext.mixed_split: invalid value 'yes'\n"


@pytest.mark.parametrize("argv,code,stream,text", [
    (["tiny-model-path", "dsa"], 0, "stdout", tiny_dsa_path() + "\n"),
    (["tiny-model-path", "llama"], 2, "stderr", "invalid choice: 'llama'"),
])
def test_the_console_entry_exits_with_the_commands_code(argv, code, stream, text):
    out = subprocess.run([sys.executable, "-m", "vllm_ascend_ext", *argv], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == code
    assert text in getattr(out, stream)


def test_run_batch_mirrors_the_steps_of_vllms_command():
    """RunBatchCommand.cmd repeats vLLM's run-batch steps without the metadata lookup;
    if vLLM's command gains a step, this fails and the plugin's copy must follow."""
    import inspect

    from vllm.entrypoints.cli.run_batch import RunBatchSubcommand

    from vllm_ascend_ext.cli.vllm_commands import RunBatchCommand

    def calls(fn) -> set[str]:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        return {ast.unparse(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}

    assert calls(RunBatchSubcommand.cmd) == {
        "logger.info", "importlib.metadata.version", "start_http_server", "asyncio.run",
        "run_batch_main"}
    assert calls(RunBatchCommand.cmd) == {
        "logger.info", "start_http_server", "asyncio.run", "run_batch_main"}


def test_teardown_output_is_silenced_but_exit_handlers_still_print():
    code = textwrap.dedent("""
        import atexit, sys
        from vllm_ascend_ext.cli.entry import _silence_interpreter_teardown
        atexit.register(_silence_interpreter_teardown)  # as console_main does, first
        class Noisy:  # like nanobind's leak report: printed while modules are torn down
            def __del__(self):
                sys.__stderr__.write("teardown noise\\n")
        keep = Noisy()
        # vLLM's and multiprocessing's handlers are registered later, so they run earlier.
        atexit.register(lambda: sys.stderr.write("exit handler output\\n"))
    """)
    for silenced in (True, False):
        src = code if silenced else code.replace("atexit.register(_silence", "(_silence")
        out = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        assert "exit handler output" in out.stderr
        assert ("teardown noise" in out.stderr) is not silenced
