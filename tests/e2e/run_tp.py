"""Run an embedded tiny model with tensor parallelism (multiprocess executor, one worker
process per rank) and print one JSON line of results.

    python tests/e2e/run_tp.py --tp N [--ep] [--model qwen-moe] [--drop-all-reduce]
                               [--swap-expert-shard] [--executor mp|ray]
                               [--ray-narrow-visible]

The prompts and lengths are run_dp.py's: ``run_dp.py --dp 1`` is the reference of both.

Each rank reports its worker, model runner, device runtime and the device communicator
class of its tensor- and expert-parallel groups (``collective_rpc``). Negative control:
``--drop-all-reduce`` makes the plugin's communicator return its input from
``all_reduce`` (each rank keeps only its own partial sums), which must change the result;
the controls live in run_dp.py, which vLLM imports in every worker process
(``worker_extension_cls``). ``--executor ray`` runs the workers as actors of the Ray
cluster ``RAY_ADDRESS`` names (one "NPU" resource each); ``--ray-narrow-visible`` (its
control) lets Ray narrow each actor's ``ASCEND_RT_VISIBLE_DEVICES`` to its own device,
which the NPU worker must refuse at start (rank 1 then sees one device).
"""

from __future__ import annotations

import argparse
import json

# run_dp's prompts and environment (its import sets it): one reference run for both
from run_dp import MAX_TOKENS, PROMPTS, _facts, worker_options


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--model", default="qwen-moe")
    ap.add_argument("--drop-all-reduce", action="store_true")
    ap.add_argument("--ep", action="store_true")
    ap.add_argument("--swap-expert-shard", action="store_true")
    ap.add_argument("--executor", choices=("mp", "ray"), default="mp")
    ap.add_argument("--ray-narrow-visible", action="store_true")
    args = ap.parse_args()
    extra = worker_options(vars(args))
    from vllm import LLM, SamplingParams

    from vllm_ascend_ext.cli.plugin_commands import _tiny_paths

    if args.ray_narrow_visible:     # the control: Ray narrows each actor's visible devices
        from vllm.platforms import current_platform

        current_platform.ray_noset_device_env_vars = []

    llm = LLM(model=_tiny_paths()[args.model](), dtype="float32", seed=0, max_model_len=512,
              enforce_eager=True, tensor_parallel_size=args.tp,
              distributed_executor_backend=args.executor, **extra)
    params = [SamplingParams(max_tokens=n, temperature=0.0, logprobs=1, ignore_eos=True)
              for n in MAX_TOKENS]
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    ranks = llm.collective_rpc(_facts)
    first = ranks[0]
    print("RESULT " + json.dumps({
        "engine": {k: first[k] for k in ("worker", "runner", "runtime")},
        "ranks": ranks,
        "tokens": [o.outputs[0].token_ids for o in outs],
        "logprobs": [[lp[t].logprob for t, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)]
                     for o in outs]}), flush=True)


if __name__ == "__main__":
    main()
