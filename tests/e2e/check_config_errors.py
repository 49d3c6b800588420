"""Feed bad ``ascend_ext`` configs to vLLM's own engine-config path (emulated).

Prints one JSON line: for each config (then a bad config through ``LLM(...)``, an fp8
KV cache, data parallelism with a MoE and a dense model, MC2 forced on an A2, the
all-to-all forced on TP2 + EP2 without DP for vLLM's MoE blocks and on TP2 without EP, a
bad ``ASCEND_EXT_SOC``),
the exception type and message raised by
``EngineArgs(...).create_engine_config()``, which runs the platform's
``check_and_update_config`` before any model weight is loaded.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CONFIGS = [
    {"ascend_ext": {"mixed_splt": "on"}},
    {"ascend_ext": {"mixed_split": "false"}},
    {"ascend_ext": {"mixed_split": True}},
    {"ascend_ext": {"sfa": {"preprocess": "prolog"}}},
    {"ascend_ext": {"sfa": "native"}},
    {"ascend_ext": {"mixed_split": "on"}, "unrelated_key": 1},  # valid: must pass
]


def main() -> None:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms import current_platform

    from vllm_ascend_ext.models import tiny_model_path, tiny_qwen_moe_path

    def attempt(model=None, **kwargs) -> dict:
        try:
            EngineArgs(model=model or tiny_model_path(), dtype="float32", max_model_len=512,
                       **kwargs).create_engine_config()
            return {"ok": True}
        except Exception as exc:  # noqa: BLE001 - we report whatever vLLM surfaced
            return {"ok": False, "type": type(exc).__name__, "message": str(exc)}

    results = [attempt(additional_config=cfg) for cfg in CONFIGS]
    # The same through LLM(...), as a user script calls it.
    from vllm import LLM

    try:
        LLM(model=tiny_model_path(), dtype="float32", max_model_len=512,
            additional_config={"ascend_ext": {"mixed_split": "yes"}})
        results.append({"ok": True})
    except Exception as exc:  # noqa: BLE001 - we report whatever vLLM surfaced
        results.append({"ok": False, "type": type(exc).__name__, "message": str(exc)})
    # An attention the backend cannot serve: refused by the preflight, still no engine.
    results.append(attempt(kv_cache_dtype="fp8"))
    # Data parallelism passes the checks for a MoE model (the communicator exchanges its
    # tokens: tests/e2e/test_distributed.py) and for a dense one.
    results.append(attempt(model=tiny_qwen_moe_path(), data_parallel_size=2))
    results.append(attempt(data_parallel_size=2))
    # MC2 forced where the documentation rules it out (an A2 with 2 EP ranks, fp32, 2048 tokens):
    # refused naming each reason; "auto" there keeps the all-gather exchange and starts.
    mc2 = dict(model=tiny_qwen_moe_path(), data_parallel_size=2, enable_expert_parallel=True)
    results.append(attempt(**mc2, additional_config={"ascend_ext": {"moe_dispatch": "mc2"}}))
    results.append(attempt(**mc2, additional_config={"ascend_ext": {"moe_dispatch": "auto"}}))
    # The all-to-all forced on TP2 + EP2 without DP for a model whose MoE blocks are vLLM's:
    # its layers split the tokens over TP (moe/tp_split.py), it starts; on TP2 without
    # expert parallelism there is nothing to exchange: refused, saying so.
    a2a = {"ascend_ext": {"moe_dispatch": "alltoall"}}
    for ep in (True, False):
        results.append(attempt(model=tiny_qwen_moe_path(), tensor_parallel_size=2,
                               enable_expert_parallel=ep, additional_config=a2a))
    # The SoC to emulate is read when the config is checked.
    os.environ["ASCEND_EXT_SOC"] = "ascend999"
    results.append(attempt())
    print("RESULT " + json.dumps({"platform": type(current_platform).__name__,
                                  "results": results}))


if __name__ == "__main__":
    main()
