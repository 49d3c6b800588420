"""Offline generation with the plugin, emulated on the CPU (no NPU needed).

    ASCEND_EXT_EMULATE=1 python examples/offline_emulated.py [--dtype bfloat16]

fp32 by default (the emulation's exact mode); ``--dtype bfloat16`` as on an NPU, which
contract mode (``ASCEND_EXT_NPU_CONTRACT=1``) needs: the NPU operators take fp16/bf16.
"""

import sys

from vllm import LLM, SamplingParams

from vllm_ascend_ext.models import tiny_model_path

if __name__ == "__main__":  # vLLM spawns workers: keep the guard
    dtype = sys.argv[sys.argv.index("--dtype") + 1] if "--dtype" in sys.argv else "float32"
    llm = LLM(
        model=tiny_model_path(),  # embedded tiny Qwen3-style model, no download
        dtype=dtype,
        max_model_len=1024,
        additional_config={"ascend_ext": {"mixed_split": "auto"}},
    )
    params = SamplingParams(max_tokens=16, temperature=0.0, logprobs=1)
    for out in llm.generate(["the quick brown fox", "attention is computed over"], params):
        print(repr(out.outputs[0].text), out.outputs[0].token_ids)
