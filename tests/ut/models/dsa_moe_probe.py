"""Run by test_dsa_mlp.py in its own process (it initialises a one-rank distributed
group): builds vLLM's DeepseekV2MoE and the plugin's DsaMoE from the tiny DSA config,
gives them the same weights and prints, as JSON, whether their parameters (names, shapes,
dtypes) and their outputs on the same tokens are equal; with ``--perturb`` the plugin's
shared expert gets one weight changed first (the negative control)."""

from __future__ import annotations

import json
import sys

import torch
from transformers import AutoConfig
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
from vllm.forward_context import set_forward_context
from vllm.model_executor.models.deepseek_v2 import DeepseekV2MoE

from vllm_ascend_ext.cli.plugin_commands import _tiny_paths
from vllm_ascend_ext.models.dsa_mlp import DsaMoE


def main(port: int) -> None:
    # The plugin's registrations (its MoE method among them), as vLLM makes them in an
    # engine: on the emulated NPU platform vLLM's own unquantized MoE has no kernel.
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    cfg = AutoConfig.from_pretrained(_tiny_paths()["dsa"]())
    vc = VllmConfig()
    with set_current_vllm_config(vc):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{port}")
        ensure_model_parallel_initialized(1, 1)
        ours = DsaMoE(config=cfg, parallel_config=vc.parallel_config, quant_config=None,
                      prefix="model.layers.1.mlp", layer_ops="fused")
        changed = DsaMoE(config=cfg, parallel_config=vc.parallel_config, quant_config=None,
                         prefix="model.layers.3.mlp", layer_ops="fused")
        vllms = DeepseekV2MoE(config=cfg, parallel_config=vc.parallel_config, quant_config=None,
                              prefix="model.layers.2.mlp", apply_routed_scale_to_output=True)
    shapes = [{k: (tuple(v.shape), str(v.dtype)) for k, v in m.named_parameters()}
              for m in (ours, vllms)]
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in vllms.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
        ours.load_state_dict(vllms.state_dict())
        changed.load_state_dict(vllms.state_dict())
        changed.shared_experts.down_proj.weight[0, 0] += 1.0
        for m in (ours, changed, vllms):
            for mod in m.modules():
                method = getattr(mod, "quant_method", None)
                if method is not None and hasattr(method, "process_weights_after_loading"):
                    method.process_weights_after_loading(mod)
        x = torch.randn(5, cfg.hidden_size, generator=g)
        with set_current_vllm_config(vc), set_forward_context(None, vc, num_tokens=5):
            a, b, perturbed = ours(x), vllms(x), changed(x)
    print("RESULT " + json.dumps({"parameters_equal": shapes[0] == shapes[1],
                                  "parameters": sorted(shapes[0]),
                                  "outputs_equal": bool(torch.equal(a, b)),
                                  "perturbed_equal": bool(torch.equal(perturbed, b)),
                                  "max_abs": float(b.abs().max())}))


if __name__ == "__main__":
    main(int(sys.argv[1]))
