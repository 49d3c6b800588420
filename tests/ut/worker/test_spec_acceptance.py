"""The worker's acceptance counter (``worker/spec_acceptance.py``) against an explicit
count over random rejection-sampler outputs (ragged drafts, -1 after the first rejection),
with no host read while recording; the end-of-run line, logged once."""

from __future__ import annotations

import logging
import random

import torch

from vllm_ascend_ext.ops.counting import OpCounter
from vllm_ascend_ext.worker.spec_acceptance import SpecAcceptance

SYNC_OPS = ("aten._local_scalar_dense", "aten.nonzero", "aten.item")


def _step(rng, k):
    b = rng.randint(1, 6)
    drafts = [rng.randint(0, k) for _ in range(b)]
    width = max(drafts) + 1
    rows = []
    for n in drafts:
        accepted = rng.randint(0, n)
        rows.append([rng.randint(0, 99) for _ in range(1 + accepted)]
                    + [-1] * (width - 1 - accepted))
    return torch.tensor(rows), drafts


def test_counts_equal_an_explicit_count_without_host_reads():
    rng, k = random.Random(0), 3
    counter = SpecAcceptance("mtp", k)
    steps = [_step(rng, k) for _ in range(40)]
    with OpCounter() as ops:
        for sampled, drafts in steps:
            counter.record(sampled, drafts)
    total = ops.total()
    assert sum(total.get(name, 0) for name in SYNC_OPS) == 0, total
    # one reduction per step that carried drafts (not vacuous)
    assert total.get("aten.sum", 0) == sum(1 for _, d in steps if max(d) > 0) > 30
    want, drafts_want, tokens_want = [0] * k, 0, 0
    for sampled, drafts in steps:
        for row, n in zip(sampled.tolist(), drafts):
            drafts_want += n > 0
            tokens_want += n
            for j in range(n):
                if row[1 + j] == -1:
                    break
                want[j] += 1
    assert counter.per_position() == want and sum(want) > 0
    assert (counter.drafts, counter.draft_tokens) == (drafts_want, tokens_want)
    rate = sum(want) / tokens_want
    assert f"acceptance={rate:.1%}" in counter.summary()
    assert f"per_position={want}" in counter.summary()


def test_the_final_line_is_logged_once(caplog):
    counter = SpecAcceptance("ngram", 2)
    counter.record(torch.tensor([[5, 6, -1], [7, -1, -1]]), [2, 2])
    with caplog.at_level(logging.INFO, logger="vllm.ascend_ext"):
        counter.log_final()
        counter.log_final()
    lines = [r.getMessage() for r in caplog.records if "speculative decoding" in r.getMessage()]
    assert lines == ["ascend_ext speculative decoding: method=ngram drafts=2 draft_tokens=4 "
                     "accepted=1 acceptance=25.0% per_position=[1, 0] "
                     "mean_acceptance_length=1.50"]
