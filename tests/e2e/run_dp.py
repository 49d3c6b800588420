"""Run an embedded tiny model with data parallelism, one process per DP rank the way
vLLM documents offline data parallelism (``VLLM_DP_RANK`` ... in each process, one
engine each, meeting in the MoE layers), and print one JSON line of results.

    python tests/e2e/run_dp.py --dp N [--tp M] [--ep] [--model qwen-moe] [--dtype float32]
                               [--drop-combine-sum] [--swap-expert-shard]
                               [--max-num-batched-tokens T]
                               [--moe-dispatch auto|allgather|mc2|alltoall]
                               [--mc2-rotate-experts] [--a2a-roll-placement] [--mtp K]
                               [--long-prompt N] [--graphs [--skip-graph-collectives]]
                               [--tp-split-unreduced]

The prompts are split unevenly (rank 0 takes most of them, and rank 1's finish early), so
the idle rank runs vLLM's dummy batches while the other still decodes. ``--dp 1`` runs
every prompt in one engine (the reference). Negative control: ``--drop-combine-sum``
makes the plugin's communicator keep each rank's own slice in ``reduce_scatterv``
without summing the other ranks' partial expert outputs; ``--swap-expert-shard`` (with
``--ep``) makes each rank compute its own expert weights as the next rank's experts.
vLLM imports this module in each worker (``worker_extension_cls``), and the import
applies them there. ``--ep`` turns on expert parallelism (``enable_expert_parallel``). ``--mc2-rotate-experts``
(negative control of the MC2 dispatcher) dispatches every pair to the expert ``L`` ids on;
``--a2a-roll-placement`` (the all-to-all dispatcher's) plans every rank's exchange with the
expert maps rolled by one rank, so rows reach a rank holding other experts. With
``--moe-dispatch alltoall`` each worker counts the dispatcher's host reads.
``--long-prompt N`` adds a prompt of ``N`` token ids (rank 0's, in one step with a large
enough ``--max-num-batched-tokens``): a prefill-sized step beside the decode-sized ones.
``--graphs`` starts without ``--enforce-eager`` (decode graphs); its control
``--skip-graph-collectives`` replays them without their captured collectives.
``--tp-split-unreduced`` (control of a layer that splits the tokens over TP itself,
``moe/tp_split.py``) makes its kernel report its output unreduced, so vLLM's runner
all-reduces every rank's complete copy. ``--mtp K``: MTP speculation with K drafts (the checkpoint's MTP layer, whose MoE layer
meets the other ranks' in every draft step, dummy ones included); ``--oracle FILE RATE``:
the e2e harness's draft oracle (``spec_harness.py``) in every worker, FILE a ``--dp 1``
result.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# (no VLLM_CPU_OMP_THREADS_BIND here: the emulated platform leaves the NPU workers'
# threads unbound itself, so a TP engine starts on this one-NUMA-node machine as a user's)

DROP = "RUN_DP_DROP_COMBINE_SUM"
if os.environ.get(DROP) == "1":          # in the worker processes, imported by vLLM
    from vllm_ascend_ext.distributed.communicator import AscendCommunicator

    def _own_slice_only(self, input_, dim=-1, sizes=None):
        begin = sum(sizes[:self.rank_in_group])
        return input_.narrow(dim, begin, sizes[self.rank_in_group]).contiguous()

    AscendCommunicator.reduce_scatterv = _own_slice_only


DROP_ALL_REDUCE = "RUN_TP_DROP_ALL_REDUCE"
if os.environ.get(DROP_ALL_REDUCE) == "1":          # run_tp.py's control, in the workers
    from vllm_ascend_ext.distributed.communicator import AscendCommunicator

    AscendCommunicator.all_reduce = lambda self, input_: input_

SWAP = "RUN_DP_SWAP_EXPERT_SHARD"
_method = None
if os.environ.get(SWAP) == "1":          # in the worker processes, imported by vLLM
    from vllm_ascend_ext.moe import method as _method
if _method is not None and not hasattr(_method.expert_shard, "swapped"):
    # once per process: a worker may import this module more than once
    import torch

    _shard_of = _method.expert_shard

    def _neighbours_shard(name, expert_map, global_experts, local_experts):
        """Each rank computes its own weights as the next rank's experts."""
        if expert_map is not None:
            expert_map = torch.roll(expert_map, local_experts)
        return _shard_of(name, expert_map, global_experts, local_experts)

    _neighbours_shard.swapped = True
    _method.expert_shard = _neighbours_shard


ROTATE = "RUN_DP_MC2_ROTATE_EXPERTS"
if os.environ.get(ROTATE) == "1":          # in the worker processes, imported by vLLM
    from vllm_ascend_ext.moe import method as _mc2_method

    if not hasattr(_mc2_method.routed_experts_mc2, "rotated"):
        _mc2_of = _mc2_method.routed_experts_mc2

        def _rotated(x, weights, ids, ffn, plan, **kw):
            """Every pair dispatched to the expert L ids on (the next rank's)."""
            return _mc2_of(x, weights, (ids + plan.local) % plan.experts, ffn, plan, **kw)

        _rotated.rotated = True
        _mc2_method.routed_experts_mc2 = _rotated


SKIP_GRAPH_COLLECTIVES = "RUN_DP_SKIP_GRAPH_COLLECTIVES"
if os.environ.get(SKIP_GRAPH_COLLECTIVES) == "1":     # in the workers: the graphs' control
    from vllm_ascend_ext.emulation import cpu_npu_graph as _graphs_mod

    if not hasattr(_graphs_mod.CpuGraph.replay, "skipping"):
        _replay_of = _graphs_mod.CpuGraph.replay

        def _replay_without_collectives(self):
            """Replays keep the capture's collectives out (each rank its own values)."""
            items = self._items
            self._items = [i for i in items if not (isinstance(i, _graphs_mod._Call)
                                                    and _graphs_mod.is_collective(i.func))]
            try:
                _replay_of(self)
            finally:
                self._items = items

        _replay_without_collectives.skipping = True
        _graphs_mod.CpuGraph.replay = _replay_without_collectives


UNREDUCED = "RUN_DP_TP_SPLIT_UNREDUCED"
if os.environ.get(UNREDUCED) == "1":          # in the workers: the TP split's control
    from vllm_ascend_ext.moe import tp_split as _tp_split

    _tp_split.TpTokenSplit.output_is_reduced = lambda self: False


A2A_ROLL = "RUN_DP_A2A_ROLL_PLACEMENT"
A2A_READS = "RUN_DP_A2A_COUNT_HOST_READS"
if os.environ.get(A2A_ROLL) == "1" or os.environ.get(A2A_READS) == "1":   # in the workers
    from vllm_ascend_ext.moe import alltoall as _a2a

    if os.environ.get(A2A_ROLL) == "1" and not hasattr(_a2a.placement, "rolled"):
        _placement_of = _a2a.placement

        def _rolled(maps):
            """Every rank plans with the maps rolled by one: rows go to the next rank."""
            return _placement_of(maps[1:] + maps[:1])

        _rolled.rolled = True
        _a2a.placement = _rolled
    if os.environ.get(A2A_READS) == "1" and not hasattr(_a2a.host_read, "reads"):
        _read_of = _a2a.host_read

        def _counted_read(tensor):
            _counted_read.reads += 1
            return _read_of(tensor)

        _counted_read.reads = 0
        _a2a.host_read = _counted_read


def _a2a_host_reads():
    import sys

    mod = sys.modules.get("vllm_ascend_ext.moe.alltoall")
    return getattr(getattr(mod, "host_read", None), "reads", None)


class WorkerExtension:
    """Naming it makes vLLM import this module in each worker; ``install_oracle`` (run
    through ``collective_rpc``) puts the test's draft oracle in the worker's drafter."""

    def install_oracle(self, plain_file: str, rate: float) -> bool:
        # spec_harness sits beside this module, on the path vLLM imported it from
        from spec_harness import oracle_drafts
        oracle_drafts(self.model_runner, plain_file, rate)
        drafter = type(self.model_runner.drafter)
        dummy = drafter.dummy_run
        calls = self.dummy_drafts = [0]      # the drafter's dummy runs from here on

        def counted(drafter_self, *args, **kwargs):
            calls[0] += 1
            return dummy(drafter_self, *args, **kwargs)
        drafter.dummy_run = counted
        return True


from dp_prompts import MAX_TOKENS, PROMPTS  # noqa: E402  (after the environment above)

LONG_MAX_TOKENS = 4
TOP_LOGPROBS = 5      # each position's most likely tokens ("top"), for noise-aware comparisons


def _prompts(long: int) -> tuple[list, list[int]]:
    """The prompts and their token budgets; ``long``: one more of that many token ids."""
    if not long:
        return list(PROMPTS), list(MAX_TOKENS)
    ids = [11 + (7 * i) % 997 for i in range(long)]
    return [*PROMPTS, {"prompt_token_ids": ids}], [*MAX_TOKENS, LONG_MAX_TOKENS]


def _shares(dp: int, n: int = len(PROMPTS)) -> list[list[int]]:
    if dp == 1:
        return [list(range(n))]
    extra = list(range(len(PROMPTS), n))        # the long prompt: rank 0's
    return [[0, 1, 2, *extra], [3]] if dp == 2 else [list(range(r, n, dp)) for r in range(dp)]


def worker_options(args: dict) -> dict:
    """The engine options and worker environment the flags ask for (run_tp.py too)."""
    extra = {"enable_expert_parallel": bool(args.get("ep"))}
    if args.get("mtp"):
        extra["speculative_config"] = {"method": "mtp", "num_speculative_tokens": args["mtp"]}
    if args.get("oracle"):
        extra["worker_extension_cls"] = "run_dp.WorkerExtension"
    if args.get("max_num_batched_tokens"):
        extra["max_num_batched_tokens"] = args["max_num_batched_tokens"]
    if args.get("max_num_seqs"):      # also what MC2's decode-step buffers are sized for
        extra["max_num_seqs"] = args["max_num_seqs"]
    if args.get("moe_dispatch"):
        extra["additional_config"] = {"ascend_ext": {"moe_dispatch": args["moe_dispatch"]}}
    if args.get("moe_dispatch") == "alltoall":
        args["a2a_count_host_reads"] = True
    for flag, env in (("drop_combine_sum", DROP), ("swap_expert_shard", SWAP),
                      ("drop_all_reduce", DROP_ALL_REDUCE), ("mc2_rotate_experts", ROTATE),
                      ("a2a_roll_placement", A2A_ROLL), ("a2a_count_host_reads", A2A_READS),
                      ("skip_graph_collectives", SKIP_GRAPH_COLLECTIVES),
                      ("tp_split_unreduced", UNREDUCED)):
        if args.get(flag):
            os.environ[env] = "1"
            extra["worker_extension_cls"] = "run_dp.WorkerExtension"
    return extra


def _rank(rank: int, dp: int, port: int, args: dict, queue) -> None:
    if dp > 1:
        os.environ.update(VLLM_DP_RANK=str(rank), VLLM_DP_RANK_LOCAL=str(rank),
                          VLLM_DP_SIZE=str(dp), VLLM_DP_MASTER_IP="127.0.0.1",
                          VLLM_DP_MASTER_PORT=str(port))
    extra = worker_options(args)
    from vllm import LLM, SamplingParams

    from vllm_ascend_ext.cli.plugin_commands import _tiny_paths

    prompts, max_tokens = _prompts(args.get("long_prompt") or 0)
    llm = LLM(model=_tiny_paths()[args["model"]](), dtype=args["dtype"], seed=0,
              max_model_len=max(512, (args.get("long_prompt") or 0) + 64), enforce_eager=not args.get("graphs"),
              tensor_parallel_size=args["tp"], **extra)
    if args.get("oracle"):
        llm.collective_rpc("install_oracle", args=(args["oracle"][0], float(args["oracle"][1])))
    mine = _shares(dp, len(prompts))[rank]
    params = [SamplingParams(max_tokens=max_tokens[i], temperature=0.0, logprobs=TOP_LOGPROBS,
                             ignore_eos=True) for i in mine]
    outs = llm.generate([prompts[i] for i in mine], params, use_tqdm=False)
    workers = llm.collective_rpc(_facts)        # one per TP rank of this engine
    queue.put((rank, workers, {i: [o.outputs[0].token_ids,
                                  [lp[t].logprob for t, lp in zip(o.outputs[0].token_ids,
                                                                   o.outputs[0].logprobs)],
                                  o.prompt_token_ids,
                                  [{str(t): p.logprob for t, p in lp.items()}
                                   for lp in o.outputs[0].logprobs]]
                              for i, o in zip(mine, outs)}))


VISIBLE_ENV = "ASCEND_RT_VISIBLE_DEVICES"


def _facts(wrapper) -> dict:
    """One rank's worker, runner, device runtime, ranks and group communicators (run
    through ``collective_rpc``; run_tp.py reports the same)."""
    from vllm.distributed.parallel_state import get_dp_group, get_tp_group

    from vllm_ascend_ext.contract import mode
    from vllm_ascend_ext.worker import npu_device

    worker = getattr(wrapper, "worker", wrapper)
    runtime = npu_device.current_runtime()
    contract = None
    if mode.enabled():   # this worker's torch_npu calls, checked by its harness
        h = mode.harness()
        contract = {"calls": dict(h.calls), "violations": h.violations, "summary": h.summary()}
    accept = getattr(worker.model_runner, "spec_acceptance", lambda: None)()
    return {"contract": contract,
            "acceptance": None if accept is None else {
                "drafts": accept.drafts, "draft_tokens": accept.draft_tokens,
                "per_position": accept.per_position()},
            "dummy_drafts": getattr(worker, "dummy_drafts", [None])[0],
            "cudagraph_mode": worker.vllm_config.compilation_config.cudagraph_mode.name,
            "compilation_mode": worker.vllm_config.compilation_config.mode.name,
            "sequence_parallel_moe": worker.vllm_config.parallel_config.use_sequence_parallel_moe,
            "sequence_parallel_layers": sum(bool(m.sequence_parallel)
                                            for m in _moe_methods(worker.model_runner.model)),
            # layers that split the tokens over TP themselves (moe/tp_split.py)
            "tp_split_layers": sum(m.moe_kernel is not None
                                   for m in _moe_methods(worker.model_runner.model)),
            "worker": type(worker).__name__, "runner": type(worker.model_runner).__name__,
            "runtime": getattr(runtime, "__stand_in__", None) if runtime is not None else None,
            "dp_rank": get_dp_group().rank_in_group, "tp_rank": get_tp_group().rank_in_group,
            "device_index": getattr(worker, "device_index", None), "visible_devices": os.environ.get(VISIBLE_ENV),
            "tp_communicator": type(get_tp_group().device_communicator).__name__,
            "ep_communicator": _ep_communicator(),
            "graphs": _graphs(worker.model_runner.model),
            "expert_shard": _first_shard(worker.model_runner.model),
            "mc2_layers": _mc2_layers(worker.model_runner.model),
            "a2a_layers": sum(getattr(m, "a2a", None) is not None
                              for m in _moe_methods(worker.model_runner.model)),
            "a2a_host_reads": _a2a_host_reads()}


def _ep_communicator() -> str | None:
    """The EP group's communicator class (None for a model without experts: no EP group)."""
    from vllm.distributed import parallel_state

    group = getattr(parallel_state, "_EP", None)
    return None if group is None else type(group.device_communicator).__name__


def _graphs(model) -> dict:
    """This rank's decode graphs: how many were captured, replayed, and the collectives
    (c10d calls) the captured graphs hold."""
    from engine_info import captured_graphs  # beside this module, on vLLM's import path

    graphs = captured_graphs(model)
    return {"captured": len(graphs), "replays": sum(getattr(g, "replays", 0) for g in graphs),
            "collectives": sorted({name for g in graphs for name in g.collectives()}),
            "collectives_per_graph": sorted({len(g.collectives()) for g in graphs})}


def _moe_methods(model) -> list:
    return [m.quant_method for m in model.modules()
            if getattr(getattr(m, "quant_method", None), "shard", None) is not None]


def _first_shard(model) -> str | None:
    """The expert shard of the model's first MoE layer (its MoE method's)."""
    methods = _moe_methods(model)
    return methods[0].shard.describe() if methods else None


def _mc2_layers(model) -> int:
    """How many MoE layers exchange tokens through the MC2 dispatcher."""
    return sum(getattr(m, "mc2", None) is not None for m in _moe_methods(model))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--model", default="qwen-moe")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--tp", type=int, default=1, help="tensor parallel ranks per engine")
    ap.add_argument("--ep", action="store_true")
    ap.add_argument("--drop-combine-sum", action="store_true")
    ap.add_argument("--swap-expert-shard", action="store_true")
    ap.add_argument("--max-num-batched-tokens", type=int, default=0)
    ap.add_argument("--max-num-seqs", type=int, default=0)
    ap.add_argument("--moe-dispatch", default="", help="ascend_ext.moe_dispatch")
    ap.add_argument("--mc2-rotate-experts", action="store_true")
    ap.add_argument("--tp-split-unreduced", action="store_true")
    ap.add_argument("--a2a-roll-placement", action="store_true")
    ap.add_argument("--mtp", type=int, default=0)
    ap.add_argument("--long-prompt", type=int, default=0, help="one more prompt of N tokens")
    ap.add_argument("--graphs", action="store_true", help="no --enforce-eager")
    ap.add_argument("--skip-graph-collectives", action="store_true")
    ap.add_argument("--oracle", nargs=2, metavar=("PLAIN_RESULT", "RATE"))
    args = vars(ap.parse_args())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # the DP ranks fork from this process, as vLLM's offline data-parallel example starts
    # them (multiprocessing's default on Linux; forked from the e2e zygote they find vLLM
    # imported: 17 s for a DP2 run instead of 26 s); each engine's own workers are spawned
    # (the NPU platform's choice, taken in emulation too)
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, args["dp"], port, args, queue))
             for r in range(args["dp"])]
    for p in procs:
        p.start()
    got = [queue.get(timeout=540) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        if p.exitcode is None:
            p.kill()
    ranks = sorted(got, key=lambda g: g[0])
    outputs = {i: v for _, _, part in ranks for i, v in part.items()}
    order = sorted(outputs, key=int)
    print("RESULT " + json.dumps({
        "engine": {k: ranks[0][1][0][k] for k in ("worker", "runner", "runtime")},
        "ranks": [worker for _, workers, _ in ranks for worker in workers],
        "prompt_token_ids": [outputs[i][2] for i in order],
        "tokens": [outputs[i][0] for i in order],
        "logprobs": [outputs[i][1] for i in order],
        "top": [outputs[i][3] for i in order]}), flush=True)


if __name__ == "__main__":
    main()
