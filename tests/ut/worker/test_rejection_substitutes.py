"""The NPU's substitutes of vLLM's rejection-sampler kernels (worker/kernel_substitutes.py)
against explicit per-request loops written from the Triton kernels
(``vllm/v1/sample/rejection_sampler.py``), and against vLLM's own CPU (C++)
implementations of the same kernels, on random batches: ragged draft counts (0 included),
greedy and random rows mixed, padded drafts (-1), with and without draft probabilities.
Negative control: a substitute that ignores the first rejection differs from the loop.
"""

from __future__ import annotations

import random

import pytest
import torch

from vllm_ascend_ext.worker import kernel_substitutes as ks

SEEDS = range(12)
V = 11


def _batch(seed, width=4, pad=True):
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    b = rng.randint(1, 5)
    counts = [rng.randint(0, width) for _ in range(b)]
    if sum(counts) == 0:
        counts[0] = 1
    cu = torch.tensor(list(torch.tensor(counts).cumsum(0)), dtype=torch.int32)
    n = int(cu[-1])
    target_argmax = torch.randint(0, V, (n,), generator=g)
    draft = target_argmax.clone()
    flip = torch.rand(n, generator=g) < 0.35
    draft[flip] = torch.randint(0, V, (int(flip.sum()),), generator=g)
    if pad:
        draft[torch.rand(n, generator=g) < 0.1] = -1
    target_p = torch.softmax(torch.randn(n, V, generator=g) * 2, -1)
    draft_p = torch.softmax(torch.randn(n, V, generator=g) * 2, -1)
    return dict(b=b, cu=cu, n=n, width=width, draft=draft.to(torch.int32),
                target_argmax=target_argmax, bonus=torch.randint(0, V, (b, 1), generator=g),
                is_greedy=torch.rand(b, generator=g) < 0.5, target_p=target_p, draft_p=draft_p,
                uniform=torch.rand(n, generator=g, dtype=torch.float64),
                recovered=torch.randint(0, V, (n,), generator=g, dtype=torch.int32),
                inv_q=1.0 / torch.empty(b, V).exponential_(generator=g))


def _spans(cu):
    start = 0
    for r, end in enumerate(cu.tolist()):
        yield r, start, end
        start = end


def _loop_greedy(x):
    out = torch.full((x["b"], x["width"] + 1), -7, dtype=torch.int32)
    for r, s, e in _spans(x["cu"]):
        if not x["is_greedy"][r]:
            continue
        rejected = False
        for p in range(e - s):
            if rejected:
                break
            t = int(x["target_argmax"][s + p])
            out[r, p] = t
            rejected = int(x["draft"][s + p]) != t
        if not rejected:
            out[r, e - s] = int(x["bonus"][r])
    return out


def _loop_random(x, no_draft_probs):
    out = torch.full((x["b"], x["width"] + 1), -7, dtype=torch.int32)
    for r, s, e in _spans(x["cu"]):
        if x["is_greedy"][r]:
            continue
        rejected = False
        for p in range(e - s):
            if rejected:
                break
            d = int(x["draft"][s + p])
            if d < 0:
                accepted = False
            else:
                # float32 probabilities divided in float32, as the Triton kernel loads them
                dp = (torch.tensor(1.0) if no_draft_probs else x["draft_p"][s + p, d])
                tp = x["target_p"][s + p, d]
                accepted = bool(dp > 0) and float(tp / dp) >= float(x["uniform"][s + p])
            out[r, p] = d if accepted else int(x["recovered"][s + p])
            rejected = not accepted
        if not rejected:
            out[r, e - s] = int(x["bonus"][r])
    return out


def _loop_recovered(x, no_draft_probs):
    out = torch.zeros(x["n"], dtype=torch.int32)
    for r, s, e in _spans(x["cu"]):
        for t in range(s, e):
            best, best_id = float("-inf"), 0
            for v in range(V):
                if no_draft_probs:
                    prob = 0.0 if v == int(x["draft"][t]) else float(x["target_p"][t, v])
                else:
                    prob = max(float(x["target_p"][t, v]) - float(x["draft_p"][t, v]), 0.0)
                score = prob * float(x["inv_q"][r, v])
                if score > best:
                    best, best_id = score, v
            out[t] = best_id
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_greedy_substitute_equals_the_loop(seed):
    x = _batch(seed)
    got = torch.full((x["b"], x["width"] + 1), -7, dtype=torch.int32)
    ks.rejection_greedy_sample(got, x["cu"], x["draft"], x["target_argmax"], x["bonus"],
                               x["is_greedy"], x["width"])
    assert torch.equal(got, _loop_greedy(x))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("no_draft_probs", [False, True])
def test_random_substitute_equals_the_loop(seed, no_draft_probs):
    x = _batch(seed)
    got = torch.full((x["b"], x["width"] + 1), -7, dtype=torch.int32)
    ks.rejection_random_sample(got, x["cu"], x["draft"], None if no_draft_probs else x["draft_p"],
                               x["target_p"], x["bonus"], x["recovered"], x["uniform"],
                               x["is_greedy"], x["width"], V, NO_DRAFT_PROBS=no_draft_probs)
    assert torch.equal(got, _loop_random(x, no_draft_probs))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("no_draft_probs", [False, True])
def test_recovered_tokens_substitute_equals_the_loop(seed, no_draft_probs):
    x = _batch(seed)
    got = torch.zeros(x["n"], dtype=torch.int32)
    ks.sample_recovered_tokens(got, x["cu"], x["draft"], None if no_draft_probs else x["draft_p"],
                               x["target_p"], x["inv_q"], V, NO_DRAFT_PROBS=no_draft_probs)
    assert torch.equal(got, _loop_recovered(x, no_draft_probs))


@pytest.mark.parametrize("seed", SEEDS)
def test_expand_substitute_equals_the_loop(seed):
    x = _batch(seed)
    values = torch.randint(-1, 3, (x["b"],), dtype=torch.int32)
    got = torch.full((x["n"] + 2,), 99, dtype=torch.int32)
    ks.expand(got, values, x["cu"], -1, 5)
    expected = torch.full((x["n"] + 2,), 99, dtype=torch.int32)
    for r, s, e in _spans(x["cu"]):
        expected[s:e] = 5 if int(values[r]) == -1 else int(values[r])
    assert torch.equal(got, expected)


@pytest.mark.parametrize("seed", SEEDS[:4])
def test_substitutes_agree_with_vllms_cpu_kernels(seed):
    """An independent implementation: vLLM's C++ CPU kernels, same arguments. Without
    padded (-1) drafts: vLLM 0.32's CPU random-sample kernel accepts a -1 draft, where the
    Triton kernel (and the substitute) rejects it."""
    import vllm._C  # noqa: F401 - registers the CPU kernels
    from vllm.utils import cpu_triton_utils as cpu_tl

    x = _batch(seed, pad=False)
    for fn, ref in ((ks.rejection_greedy_sample, cpu_tl._rejection_greedy_sample_kernel_impl),):
        a = torch.full((x["b"], x["width"] + 1), -7, dtype=torch.int32)
        b = a.clone()
        fn(a, x["cu"], x["draft"], x["target_argmax"], x["bonus"], x["is_greedy"], x["width"])
        ref(b, x["cu"], x["draft"], x["target_argmax"], x["bonus"], x["is_greedy"], x["width"])
        assert torch.equal(a, b)
    a = torch.full((x["b"], x["width"] + 1), -7, dtype=torch.int32)
    b = a.clone()
    args = (x["cu"], x["draft"], x["draft_p"], x["target_p"], x["bonus"], x["recovered"],
            x["uniform"], x["is_greedy"], x["width"], V)
    ks.rejection_random_sample(a, *args)
    cpu_tl._rejection_random_sample_kernel_impl(b, *args)
    assert torch.equal(a, b)


def test_negative_control_writing_past_the_first_rejection_differs():
    original = ks._write_until_rejected

    def careless(output, spans, cu, tokens, accepted, rows, bonus, max_spec_len):
        original(output, spans, cu, tokens, torch.ones_like(accepted), rows, bonus,
                 max_spec_len)

    differs = 0
    for seed in SEEDS:
        x = _batch(seed)
        got = torch.full((x["b"], x["width"] + 1), -7, dtype=torch.int32)
        ks._write_until_rejected = careless
        try:
            ks.rejection_greedy_sample(got, x["cu"], x["draft"], x["target_argmax"], x["bonus"],
                                       x["is_greedy"], x["width"])
        finally:
            ks._write_until_rejected = original
        differs += not torch.equal(got, _loop_greedy(x))
    assert differs > 0
