"""``doctor``: what this machine gives the plugin, read without the NPU runtime."""

from __future__ import annotations

import json
from argparse import Namespace

from vllm_ascend_ext.cli import doctor
from vllm_ascend_ext.platform import activation, npu_host, probe


def test_reports_the_npu_platform_facts_and_is_healthy_for_emulation(monkeypatch, capsys):
    monkeypatch.setattr(probe, "npu_device_nodes", lambda: [])           # no NPU devices
    monkeypatch.setenv("ASCEND_EXT_EMULATE", "1")
    assert doctor.run(Namespace(json=True)) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["healthy"] and data["problems"] == []
    assert data["host"]["mode"].startswith("emulation")
    emulated = data["emulated_platform"]
    assert emulated["class"].endswith("EmulatedAscendPlatform") and emulated["is_npu_platform"]
    assert "device_type" in emulated["exceptions"] and "block_size" not in emulated["exceptions"]
    platform = data["npu_platform"]
    assert platform["opaque_attention"] is True and platform["distributed_backend"] == "hccl"
    assert platform["moe"]["method"] == "vllm_ascend_ext.moe.method.AscendFusedMoEMethod"
    assert platform["moe"]["expert_parallel"].startswith("accepted")
    dispatchers = platform["moe"]["ep_dispatcher"]
    assert dispatchers["A3"].startswith("MC2") and "EP 2-384, hidden 1024-7168" in dispatchers["A3"]
    assert "EP 16/32/64" in dispatchers["A2"] and dispatchers["A5"].startswith("all-gather")
    assert platform["worker"] == "vllm_ascend_ext.worker.npu_worker.AscendNPUWorker"
    executors = platform["communicator"]["executors"]
    assert "--headless" in executors["mp"]
    assert "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES" in executors["ray"]
    graphs = platform["graph_mode"]
    assert graphs["fia_models"]["mode"] == "FULL_DECODE_ONLY"
    assert "updated per replay" in graphs["fia_models"]["why"]
    assert graphs["sfa_models"]["mode"] == "NONE" and graphs["builders"]["sfa"] == "NEVER"
    assert graphs["hybrid_models"]["mode"] == "NONE" and "Gated-DeltaNet" in graphs["hybrid_models"]["why"]
    gdn = platform["gdn"]
    assert gdn["A2"]["decode"] == "npu_recurrent_gated_delta_rule"
    assert gdn["A2"]["prefill"] == "npu_chunk_gated_delta_rule"
    assert gdn["A5"]["decode"] == "_C_ascend_ext.npu_recurrent_gated_delta_rule_ext"
    assert data["stack"]["torch"].startswith("2.13")
    assert data["extension"]["built"] is (data["extension"]["ops"] != [])
    assert data["contract_oracle"]["version"] == "2.13.0"


def test_an_npu_host_with_a_wrong_stack_is_unhealthy_with_reasons(monkeypatch, capsys):
    monkeypatch.setattr(probe, "npu_device_nodes", lambda: ["/dev/davinci0"])
    versions = {"torch-npu": "2.9.0", "vllm": "0.32.0"}
    monkeypatch.setattr(npu_host, "distribution_version", lambda name: versions.get(name))
    monkeypatch.setattr(npu_host, "cann_version", lambda home=None: "8.3.RC1")
    monkeypatch.setenv("ASCEND_EXT_SOC", "ascend910_9391")
    monkeypatch.setattr(activation, "activation",
                        lambda verify=False: activation.Activation("npu", "stub"))
    assert doctor.run(Namespace(json=False)) == 1
    out = capsys.readouterr().out
    assert "mode: npu" in out and "family: A3" in out and "source: ASCEND_EXT_SOC" in out
    assert "stack: torch_npu 2.9.0 does not match torch" in out
    # The plugin's own NPU worker is named: no worker problem, only the stack's.
    assert "worker: vllm_ascend_ext.worker.npu_worker.AscendNPUWorker" in out
    assert out.split("problems:")[-1].count("stack:") == 1
    assert "worker" not in out.split("problems:")[-1]


def test_an_unknown_soc_is_a_problem(monkeypatch):
    monkeypatch.setattr(probe, "npu_device_nodes", lambda: [])
    monkeypatch.setenv("ASCEND_EXT_EMULATE", "1")
    monkeypatch.setenv("ASCEND_EXT_SOC", "ascend999")
    data, problems = doctor.report()
    assert not data["healthy"] and problems[0].startswith("SoC: unknown Ascend SoC 'ascend999'")


def test_smoke_runs_only_on_an_npu_and_a_failing_case_is_a_problem(monkeypatch, capsys):
    from vllm_ascend_ext.tools import npu_parity

    monkeypatch.setattr(probe, "npu_device_nodes", lambda: [])
    data, problems = doctor.report(smoke=True)
    assert data["operator_smoke"]["ran"] is False and "no NPU here" in data["operator_smoke"]["why"]
    assert doctor.report()[0]["operator_smoke"]["why"].startswith("not requested")
    # An NPU host (stack versions aside) whose FIA case is out of bounds.
    monkeypatch.setattr(probe, "npu_present", lambda: True)
    failing = [npu_parity.Measured("npu_fused_infer_attention_score max abs err", 0.5, 2e-2)]
    monkeypatch.setattr(npu_parity, "SMOKE", (lambda: failing,))
    assert doctor.run(Namespace(json=True, smoke=True)) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["operator_smoke"]["ran"] is True and data["operator_smoke"]["ok"] is False
    assert any(p.startswith("smoke <lambda>: npu_fused_infer_attention_score max abs err")
               for p in data["problems"])


def test_without_emulation_on_a_cpu_the_platform_is_inactive_and_doctor_says_so(monkeypatch,
                                                                                capsys):
    monkeypatch.setattr(probe, "npu_device_nodes", lambda: [])
    monkeypatch.setattr(probe, "torch_npu_installed", lambda: False)
    monkeypatch.delenv("ASCEND_EXT_EMULATE", raising=False)
    assert doctor.run(Namespace(json=True)) == 1
    data = json.loads(capsys.readouterr().out)
    assert not data["healthy"] and data["host"]["emulate_requested"] is False
    assert data["host"]["mode"].startswith("inactive (no Ascend NPU here: set "
                                           "ASCEND_EXT_EMULATE=1")
    assert data["problems"] == [data["problems"][0]] and "ASCEND_EXT_EMULATE=1" in data["problems"][0]


def test_lists_every_embedded_tiny_model(monkeypatch, tmp_path):
    from vllm_ascend_ext.cli.plugin_commands import _tiny_paths

    monkeypatch.setenv("ASCEND_EXT_EMULATE", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))     # the generated one: not yet
    models = doctor.report()[0]["tiny_models"]
    assert set(models) == set(_tiny_paths()) == {"qwen3", "qwen-moe", "qwen-moe-wide",
                                                 "qwen3-next", "dsa", "dsa-w8a8",
                                                 "dsa-w8a8-wide", "mimo"}
    wide = [models.pop("qwen-moe-wide"), models.pop("dsa-w8a8-wide")]
    assert all(m["present"] for m in models.values())
    # doctor looks for the generated models and never writes them
    for m in wide:
        assert not m["present"] and m["path"].startswith(str(tmp_path))
    assert not any(tmp_path.iterdir())
