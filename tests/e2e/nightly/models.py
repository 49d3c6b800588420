"""What the nightly serves: the embedded tiny models, and the real models the runner's
environment names (each skipped, with the reason, where the runner lacks it).

A model is served once per setting of the feature it exercises (``mixed_split`` off vs
auto, ``sfa.preprocess`` native vs auto); the first setting is the feature-off one the
others are compared with. ``baseline="stock"`` adds a plugin-off run (vLLM's own CPU
platform) that every setting must equal in the dry run; models vLLM cannot serve on a
CPU (Gated-DeltaNet and sparse-attention layers) take their feature-off setting as the
baseline instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from vllm_ascend_ext.models import (
    tiny_dsa_path,
    tiny_model_path,
    tiny_qwen3_next_path,
    tiny_qwen_moe_path,
)

FEATURE_KEYS = {"mixed_split": ("mixed_split",), "sfa.preprocess": ("sfa", "preprocess")}


@dataclass(frozen=True)
class ServedModel:
    name: str                      # served model name and report label
    path: str | None               # None: skipped (``skip`` says why)
    kind: str                      # fia | moe | hybrid | sfa
    feature: str | None = None     # mixed_split | sfa.preprocess | None (defaults only)
    settings: tuple[str, ...] = ("default",)
    baseline: str | None = None    # "stock" (plugin off), or None: the first setting
    serve_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    gsm8k_floor: float | None = None
    min_devices: int = 1
    topology: str = ""
    skip: str | None = None

    def additional_config(self, setting: str) -> dict:
        if self.feature is None or setting == "default":
            return {}
        keys = FEATURE_KEYS[self.feature]
        inner: dict = {keys[-1]: setting}
        for k in reversed(keys[:-1]):
            inner = {k: inner}
        return {"ascend_ext": inner}


# The dry run's CPU serving arguments: fp32 (exact comparisons), a small token budget so
# prefill chunks run beside decodes (the mixed steps the split acts on), eager (the
# dry run checks the script, not compile time).
_CPU = ("--dtype", "float32", "--max-model-len", "1024", "--max-num-batched-tokens", "64",
        "--enforce-eager", "--no-enable-prefix-caching")
# An emulated Ascend 950 (A5): the SoC family on which mixed_split=auto splits.
_A5 = {"ASCEND_EXT_SOC": "ascend950"}


# On an NPU: bf16 (the NPU operators' dtypes), compiled graphs as served.
_NPU = ("--dtype", "bfloat16", "--max-model-len", "1024", "--max-num-batched-tokens", "64",
        "--no-enable-prefix-caching")


def tiny_models(npu: bool = False, split_on: str = "auto") -> list[ServedModel]:
    """The embedded tiny models; they carry the feature comparisons of the dry run. On
    an NPU there is no plugin-off run: the feature-off setting is the baseline, and the
    SoC is the machine's. ``split_on``: the feature-on ``mixed_split`` value (``auto``
    where the SoC's gate splits, i.e. Ascend 950; ``on`` on A2/A3, where auto declines)."""
    args, a5 = (_NPU, {}) if npu else (_CPU, dict(_A5))
    stock = None if npu else "stock"
    return [
        ServedModel("tiny-qwen3", tiny_model_path(), "fia", "mixed_split", ("off", split_on),
                    stock, args, a5),
        ServedModel("tiny-qwen-moe", tiny_qwen_moe_path(), "moe", baseline=stock,
                    serve_args=args),
        ServedModel("tiny-qwen3-next", tiny_qwen3_next_path(), "hybrid", "mixed_split",
                    ("off", split_on), None, args, a5),
        ServedModel("tiny-dsa-w8a8", tiny_dsa_path(quantized=True), "sfa", "sfa.preprocess",
                    ("native", "auto"), None, args),
    ]


# Real checkpoints: (env var, kind, feature, settings, GSM8K floor, NPUs, topology note).
REAL = (
    ("NIGHTLY_QWEN3", "fia", "mixed_split", ("off", "auto"), 0.85, 1,
     "Qwen3 dense (e.g. Qwen3-8B, bf16): one 64 GB NPU; Qwen3-32B: TP 2"),
    ("NIGHTLY_HYBRID", "hybrid", "mixed_split", ("off", "auto"), 0.85, 4,
     "Qwen3-Next-80B-A3B / Qwen3.5 (bf16, ~160 GB of weights): TP 4 on an Atlas 800 A2 "
     "(8 x 64 GB)"),
    ("NIGHTLY_DSA_W8A8", "sfa", "sfa.preprocess", ("native", "auto"), 0.90, 16,
     "DeepSeek-V3.2 / GLM-5 W8A8 (~700 GB of int8 weights): TP 16 on one Atlas 800 A3 "
     "(16 x 64 GB); it does not fit one Atlas 800 A2 (8 x 64 GB = 512 GB): on A2 nodes, "
     "NIGHTLY_DSA_W8A8_2NODE (the two-node stage)"),
)


def real_models(npu_devices: int, environ: dict[str, str] | None = None,
                split_on: str = "auto") -> list[ServedModel]:
    """The checkpoints ``NIGHTLY_*`` names, each with its tensor-parallel size
    (``<VAR>_TP``, default the NPUs it needs) and GSM8K floor (``<VAR>_GSM8K_MIN``);
    ``split_on`` as for :func:`tiny_models`."""
    env = os.environ if environ is None else environ
    out = []
    for var, kind, feature, settings, floor, need, topology in REAL:
        path, tp = env.get(var), int(env.get(f"{var}_TP") or need)
        skip = None
        if not path:
            skip = f"{var} is not set (a {kind} checkpoint directory; {topology})"
        elif not os.path.isdir(path):
            skip = f"{var}={path} is not a directory on this runner"
        elif npu_devices < tp:
            skip = f"needs {tp} NPUs, this runner has {npu_devices} ({topology})"
        args = ("--dtype", "bfloat16", "--tensor-parallel-size", str(tp), "--max-model-len",
                "8192", "--no-enable-prefix-caching")  # repeated prompts: no cache hits
        if feature == "mixed_split":
            settings = ("off", split_on)
        out.append(ServedModel(
            os.path.basename(os.path.normpath(path)) if path else var.lower(), path, kind,
            feature, settings, None, args, {}, float(env.get(f"{var}_GSM8K_MIN") or floor),
            tp, topology, skip))
    return out


# The two-node recipe: DeepSeek-V3.2 / GLM-5 W8A8 as DP2 x TP8 with EP16 over two Atlas 800
# A2 nodes, launched the way vLLM documents multi-node DP (docs/distributed.md).
TWO_NODE_VAR = "NIGHTLY_DSA_W8A8_2NODE"
TWO_NODE_TOPOLOGY = ("DeepSeek-V3.2 / GLM-5 W8A8 on two Atlas 800 A2 nodes: DP2 x TP8 + EP16, "
                     "node 0 (this runner) serves the API, node 1 runs headless")
# vLLM's DP flags of both nodes; the address and RPC port are added per run.
_DP = ("--data-parallel-size", "2", "--data-parallel-size-local", "1",
       "--enable-expert-parallel")


def two_node_model(npu_devices: int, *, dry: bool,
                   environ: dict[str, str] | None = None) -> ServedModel:
    """The recipe's model: the embedded tiny DSA W8A8 in a dry run (two local "nodes",
    TP1 each), else the checkpoint ``NIGHTLY_DSA_W8A8_2NODE`` names (TP8 per node;
    skipped, saying why, without it, without node 1's launcher or with fewer NPUs)."""
    if dry:
        return ServedModel("tiny-dsa-w8a8-2node", tiny_dsa_path(quantized=True), "sfa",
                           serve_args=_CPU + _DP, topology="two loopback nodes, DP2 + EP2")
    env = os.environ if environ is None else environ
    path, tp = env.get(TWO_NODE_VAR), int(env.get(f"{TWO_NODE_VAR}_TP") or 8)
    skip = None
    if not path:
        skip = f"{TWO_NODE_VAR} is not set ({TWO_NODE_TOPOLOGY})"
    elif not os.path.isdir(path):
        skip = f"{TWO_NODE_VAR}={path} is not a directory on this runner"
    elif not env.get("NIGHTLY_NODE1_LAUNCH") or not env.get("NIGHTLY_NODE0_ADDRESS"):
        skip = ("NIGHTLY_NODE1_LAUNCH (how to run a command on node 1) and "
                "NIGHTLY_NODE0_ADDRESS (this node's address node 1 reaches) must be set")
    elif npu_devices < tp:
        skip = f"needs {tp} NPUs per node, this runner has {npu_devices}"
    args = ("--dtype", "bfloat16", "--tensor-parallel-size", str(tp), "--max-model-len",
            "8192", "--no-enable-prefix-caching", *_DP)
    return ServedModel(os.path.basename(os.path.normpath(path)) + "-2node" if path
                       else TWO_NODE_VAR.lower(), path, "sfa", serve_args=args,
                       gsm8k_floor=float(env.get(f"{TWO_NODE_VAR}_GSM8K_MIN") or 0.90),
                       min_devices=tp, topology=TWO_NODE_TOPOLOGY, skip=skip)
