"""Speculative-decoding helpers shared by the e2e engine scripts (``run_gdn.py``,
``run_dsa.py``, ``run_llm.py``, ``run_dp.py``): observation (vLLM's spec-decode counters, drafter-substitute calls) and
the test-only draft oracle.

The oracle exists because the embedded tiny models' MTP layers are untrained: alone they
agree with their model in a few percent of drafts, so verify steps would almost never
accept a draft. It replaces a deterministic fraction of the proposals (chosen by prompt
and position, so every run picks the same ones) with a plain run's greedy continuation,
on the device; drafts are then accepted and rejected raggedly, at every position.
"""

from __future__ import annotations

import json

import torch


def count_substitutes() -> dict:
    """Calls of each drafter-kernel substitute (observation only: counting wrappers put in
    the substitutes' table before the engine registers it)."""
    import functools

    from vllm_ascend_ext.worker import drafter_substitutes, kernel_substitutes

    calls = {name.rsplit(".", 1)[-1]: 0 for name in drafter_substitutes.SUBSTITUTES}

    def counted(name, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper
    for name, fn in drafter_substitutes.SUBSTITUTES.items():
        kernel_substitutes.SUBSTITUTES[name] = counted(name.rsplit(".", 1)[-1], fn)
    return calls


def oracle_drafts(runner, plain_file: str, rate: float) -> dict:
    """Test harness: replace a deterministic ``rate`` of the drafter's proposals by the
    plain run's continuation (chosen by prompt and position, so every run picks the same
    ones). Device ops only: the proposals never come to the host."""
    import inspect

    with open(plain_file) as f:
        plain = json.load(f)
    full = {tuple(p): (i, list(p) + list(t))
            for i, (p, t) in enumerate(zip(plain["prompt_token_ids"], plain["tokens"]))}
    width = max(len(s) for _, s in full.values())
    cls = type(runner.drafter)
    original = cls.propose
    sig = inspect.signature(original)
    seen = {"steps": 0}

    def propose(self, *args, **kwargs):
        drafts = original(self, *args, **kwargs)
        bound = sig.bind(self, *args, **kwargs).arguments
        b, k = drafts.shape
        idx = bound.get("token_indices_to_sample")
        if idx is None:
            idx = bound["common_attn_metadata"].query_start_loc[1:b + 1] - 1
        last = bound["target_positions"][idx.long()].long()      # the last verified token
        rows, prompt_idx = [], []
        for rid in runner.input_batch.req_ids[:b]:
            i, seq = full[tuple(runner.requests[rid].prompt_token_ids)]
            rows.append(seq + [-1] * (width - len(seq)))
            prompt_idx.append(i)
        seqs = torch.tensor(rows, device=drafts.device)
        pidx = torch.tensor(prompt_idx, device=drafts.device).unsqueeze(1)
        at = last.unsqueeze(1) + 2 + torch.arange(k, device=drafts.device)
        want = seqs.gather(1, at.clamp(max=width - 1))
        pick = ((at * 7 + pidx * 17) % 100 < int(rate * 100)) & (at < width) & (want >= 0)
        seen["steps"] += 1
        return torch.where(pick, want.to(drafts.dtype), drafts)
    cls.propose = propose
    return seen


def corrupt_fia_verify_slot() -> None:
    """Negative control: FIA verify rows (2 to 4 query tokens) read one KV slot past their
    sequence, in eager steps and replayed graphs alike (both take the builder's lists)."""
    from vllm_ascend_ext.attention.fia import builder as fia_builder

    original = fia_builder.host_lists

    def host_lists(cu_q, kv_lens, num_actual_tokens):
        q = [cu_q[i + 1] - cu_q[i] for i in range(len(kv_lens))]
        kv_lens = [n + 1 if 1 < q[i] <= 4 else n for i, n in enumerate(kv_lens)]
        return original(cu_q, kv_lens, num_actual_tokens)
    fia_builder.host_lists = host_lists


def spec_metrics(llm) -> dict:
    """vLLM's speculative-decoding counters (drafts, draft tokens, accepted tokens, and
    accepted tokens per draft position), read from the engine's metrics."""
    out: dict = {}
    for m in llm.get_metrics():
        if not m.name.startswith("vllm:spec_decode"):
            continue
        key = m.name.removeprefix("vllm:spec_decode_")
        out[key] = list(m.values) if hasattr(m, "values") else m.value
    return out


def spec_result(llm, runner, substitute_calls: dict, oracle: dict | None) -> dict:
    """The RESULT fields of a speculative run: vLLM's counters, the substitutes' calls,
    the oracle's steps, and the worker's own acceptance count (with speculation)."""
    out = {"spec_metrics": spec_metrics(llm), "substitute_calls": substitute_calls,
           "oracle_steps": oracle["steps"] if oracle else 0}
    accept = runner.spec_acceptance() if hasattr(runner, "spec_acceptance") else None
    if accept is not None:
        out["acceptance"] = {"drafts": accept.drafts, "draft_tokens": accept.draft_tokens,
                             "per_position": accept.per_position(), "summary": accept.summary()}
    return out
