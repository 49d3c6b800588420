"""What vLLM's Ray executor needs of the platforms: the device key Ray places workers on,
the variable that keeps Ray from narrowing each actor's visible devices, the plugin's
environment in the actors' runtime environment (emulation), and a stand-in device runtime
that sees what ``ASCEND_RT_VISIBLE_DEVICES`` lists, as the NPU runtime does."""

from __future__ import annotations

import pytest
from vllm.config import ParallelConfig

from vllm_ascend_ext.emulation.cpu_npu import STAND_IN_DEVICES, visible_device_count
from vllm_ascend_ext.emulation.platform import EmulatedAscendPlatform, carry_plugin_env_to_ray
from vllm_ascend_ext.platform.npu import AscendNPUPlatform
from vllm_ascend_ext.platform.ray_env import with_plugin_env


@pytest.mark.parametrize("platform", [AscendNPUPlatform, EmulatedAscendPlatform])
def test_both_platforms_place_on_npus_and_keep_every_device_visible(platform):
    assert platform.ray_device_key == "NPU"
    # the name Ray's NPU accelerator reads (ray/_private/accelerators/npu.py)
    assert platform.ray_noset_device_env_vars == [
        "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"]


def test_ray_reads_the_same_noset_variable():
    npu = pytest.importorskip("ray._private.accelerators.npu")
    assert npu.NOSET_ASCEND_RT_VISIBLE_DEVICES_ENV_VAR in AscendNPUPlatform.ray_noset_device_env_vars
    assert npu.NPUAcceleratorManager.get_visible_accelerator_ids_env_var() \
        == AscendNPUPlatform.device_control_env_var


def test_the_plugins_variables_join_the_runtime_environment():
    base = {"pip": ["x"], "env_vars": {"A": "1", "ASCEND_EXT_SOC": "mine"}}
    environ = {"ASCEND_EXT_EMULATE": "1", "ASCEND_EXT_SOC": "ascend910b2", "HOME": "/root",
               "VLLM_X": "y"}
    merged = with_plugin_env(base, environ)
    assert merged == {"pip": ["x"], "env_vars": {"A": "1", "ASCEND_EXT_SOC": "mine",
                                                 "ASCEND_EXT_EMULATE": "1"}}
    assert base["env_vars"] == {"A": "1", "ASCEND_EXT_SOC": "mine"}     # not changed
    assert with_plugin_env(None, environ) == {
        "env_vars": {"ASCEND_EXT_EMULATE": "1", "ASCEND_EXT_SOC": "ascend910b2"}}
    assert with_plugin_env(None, {"HOME": "/root"}) == {"env_vars": {}}


def test_emulation_under_ray_carries_the_plugins_environment(monkeypatch):
    """The emulated platform's set-up step on a Ray configuration: the actors' runtime
    environment names ASCEND_EXT_EMULATE, which picks their platform at import."""
    pytest.importorskip("ray")
    from types import SimpleNamespace

    monkeypatch.setenv("ASCEND_EXT_EMULATE", "1")
    monkeypatch.setenv("ASCEND_EXT_SOC", "ascend910b2")
    parallel = ParallelConfig(tensor_parallel_size=2, distributed_executor_backend="ray")
    config = SimpleNamespace(parallel_config=parallel)
    carry_plugin_env_to_ray(config)
    env_vars = dict(parallel.ray_runtime_env)["env_vars"]
    assert env_vars["ASCEND_EXT_EMULATE"] == "1" and env_vars["ASCEND_EXT_SOC"] == "ascend910b2"
    mp = ParallelConfig(tensor_parallel_size=2, distributed_executor_backend="mp")
    carry_plugin_env_to_ray(SimpleNamespace(parallel_config=mp))
    assert mp.ray_runtime_env is None


@pytest.mark.parametrize("listed,count", [(None, STAND_IN_DEVICES), ("", STAND_IN_DEVICES),
                                          ("1", 1), ("0,3", 2), (" 2 , 5 ", 2), ("9", 0),
                                          ("0,1,2,3,4,5,6,7", 8)])
def test_the_stand_in_sees_the_listed_devices(listed, count):
    environ = {} if listed is None else {"ASCEND_RT_VISIBLE_DEVICES": listed}
    assert visible_device_count(environ) == count
