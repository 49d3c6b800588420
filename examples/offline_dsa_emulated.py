"""DeepSeek-V3.2-style sparse attention (SFA backend), emulated on the CPU.

    ASCEND_EXT_EMULATE=1 python examples/offline_dsa_emulated.py [--w8a8]

The embedded tiny DSA model; ``--w8a8`` takes its ModelSlim W8A8 variant, whose
``quant_model_description.json`` selects the ``ascend_ext`` quantization method and,
through the SFA route, the fused ``npu_mla_prolog_v3`` preprocessing (logged at start).
"""

import sys

from vllm import LLM, SamplingParams

from vllm_ascend_ext.models import tiny_dsa_path

if __name__ == "__main__":  # vLLM spawns workers: keep the guard
    llm = LLM(
        model=tiny_dsa_path(quantized="--w8a8" in sys.argv),
        dtype="float32",
        max_model_len=1024,
        max_num_batched_tokens=64,          # chunked prefill
        additional_config={"ascend_ext": {"sfa": {"preprocess": "auto"}}},
    )
    prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * 20)  # > 4x index_topk
    params = SamplingParams(max_tokens=16, temperature=0.0, logprobs=1)
    for out in llm.generate([prompt, "attention is computed over keys"], params):
        print(repr(out.outputs[0].text), out.outputs[0].token_ids)
