"""Whether the plugin's platform is active, and what an inactive one lacks; the CLI says
so first (an ``ascend_ext`` configuration: exit 2; ``serve``: one notice line)."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

from vllm_ascend_ext.cli import entry
from vllm_ascend_ext.platform import activation as act
from vllm_ascend_ext.platform import probe


@pytest.fixture
def host(monkeypatch):
    monkeypatch.delenv("ASCEND_EXT_EMULATE", raising=False)

    def make(devices=(), torch_npu=False, count=1, broken=False):
        monkeypatch.setattr(probe, "npu_device_nodes", lambda: list(devices))
        monkeypatch.setattr(probe, "torch_npu_installed", lambda: torch_npu)

        def device_count():
            if broken:
                raise RuntimeError("drvMngGetConsoleLogLevel failed")
            return count
        fake = types.SimpleNamespace(npu=types.SimpleNamespace(device_count=device_count))
        monkeypatch.setitem(sys.modules, "torch_npu", fake)
    return make


def test_emulation_and_npu_are_active(host, monkeypatch):
    host(devices=["/dev/davinci0"], torch_npu=True)
    assert act.activation().mode == "npu" == act.activation(verify=True).mode
    host(devices=["/dev/davinci0"], torch_npu=True, broken=True)
    assert act.activation().mode == "npu"          # torch_npu is not imported unverified
    monkeypatch.setenv("ASCEND_EXT_EMULATE", "1")
    host()
    assert act.activation().mode == "emulation" and act.activation().active


@pytest.mark.parametrize("kw,says", [
    ({}, "no Ascend NPU here: set ASCEND_EXT_EMULATE=1 to run the plugin emulated"),
    ({"devices": ["/dev/davinci0"]}, "but no torch_npu: install the plugin's npu extra"),
    ({"torch_npu": True}, "no /dev/davinci* device nodes"),
    ({"devices": ["/dev/davinci0"], "torch_npu": True, "count": 0}, "device_count() is 0"),
    ({"devices": ["/dev/davinci0"], "torch_npu": True, "broken": True},
     "RuntimeError: drvMngGetConsoleLogLevel failed"),
])
def test_an_inactive_platform_names_what_is_missing(host, kw, says):
    host(**kw)
    state = act.activation(verify=True)
    assert not state.active and says in state.why and "ASCEND_EXT_EMULATE=1" in state.why


def test_vllm_plugins_without_the_plugin_is_inactive(host, monkeypatch):
    host()
    monkeypatch.setenv("ASCEND_EXT_EMULATE", "1")
    monkeypatch.setenv("VLLM_PLUGINS", "ascend")
    state = act.activation()
    assert not state.active and "VLLM_PLUGINS='ascend' does not load ascend_ext" in state.why
    monkeypatch.setenv("VLLM_PLUGINS", "lora, ascend_ext")
    assert act.activation().mode == "emulation"


@pytest.mark.parametrize("argv,found", [
    (["serve", "m", "--additional-config", '{"ascend_ext": {"mixed_split": "on"}}'], True),
    (["serve", "m", '--additional-config={"ascend_ext": {}}'], True),
    (["serve", "m", "--additional_config", '{"other": 1}'], False),
    (["serve", "m", "--additional-config", "{ascend_ext: broken json"], True),
    (["serve", "m", "--additional-config.ascend_ext.mixed_split=on"], True),
    (["serve", "m"], False),
])
def test_ascend_ext_configuration_on_the_command_line(argv, found):
    assert entry.has_ascend_ext_config(argv) is found


def test_inactive_platform_check(host, capsys):
    host()
    config = ["serve", "m", "--additional-config", '{"ascend_ext": {}}']
    assert entry.inactive_platform_check(config) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: --additional-config has an 'ascend_ext' "
                                               "section but the plugin's platform is not active")
    assert "ASCEND_EXT_EMULATE=1" in err[0]
    assert entry.inactive_platform_check(["serve", "m"]) is None
    assert "this serves stock vLLM" in capsys.readouterr().err
    assert entry.inactive_platform_check(["serve", "--help"]) is None
    assert entry.inactive_platform_check(["bench", "serve"]) is None
    assert capsys.readouterr().err == ""


def test_the_cli_says_it_first_and_exits_2_before_loading_vllm():
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp"}
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "vllm_ascend_ext", "serve",
                          "/no/model", "--additional-config", '{"ascend_ext": {}}'],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2
    lines = [ln for ln in out.stderr.splitlines() if not ln.startswith("import time:")]
    assert lines[0].startswith("error: --additional-config has an 'ascend_ext' section") and \
        len(lines) == 1
    imported = [ln.rsplit("|", 1)[-1].strip() for ln in out.stderr.splitlines()
                if ln.startswith("import time:")]
    assert "vllm_ascend_ext" in imported and not [m for m in imported if m == "vllm" or
                                                   m.startswith("vllm.")]  # vLLM not loaded


def test_collect_env_adds_the_plugins_facts(monkeypatch, capsys):
    from vllm.entrypoints.cli.collect_env import CollectEnvSubcommand

    from vllm_ascend_ext.cli import vllm_commands

    cmd = vllm_commands.adapt(CollectEnvSubcommand())
    assert isinstance(cmd, vllm_commands.CollectEnvCommand)
    monkeypatch.setattr(CollectEnvSubcommand, "cmd", staticmethod(lambda args: print("VLLM")))
    monkeypatch.setenv("ASCEND_EXT_EMULATE", "1")
    cmd.cmd(None)
    out = capsys.readouterr().out
    assert out.startswith("VLLM\n")     # vLLM's own report first
    assert "vllm-ascend-ext (python -m vllm_ascend_ext doctor for the whole report):" in out
    assert "mode: emulation (ASCEND_EXT_EMULATE=1)" in out and "healthy: True" in out
