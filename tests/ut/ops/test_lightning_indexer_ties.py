"""``npu_lightning_indexer`` tie rule: among equal scores the lower key position wins.

The documentation states no rule and the op-plugin golden's unstable ``torch.sort`` leaves
it open; the reference fixes one so the same request selects the same keys however its
prefill is chunked and wherever its rows sit in the batch. With few indexer heads a ReLU'd
score of exactly 0 ties often (every head's dot product negative)."""

from __future__ import annotations

import random

import torch

from tests.ut.dense import write_paged
from vllm_ascend_ext.ops.lightning_indexer import npu_lightning_indexer


def _i32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def _index(q, keys, w, cu_q, lens_k, sparse_count, seed, block_size=16):
    kc, _, table = write_paged(keys, keys, block_size, 64, random.Random(seed), torch.bfloat16)
    idx, _ = npu_lightning_indexer(
        q, kc, w, actual_seq_lengths_query=_i32(cu_q), actual_seq_lengths_key=_i32(lens_k),
        block_table=table, layout_query="TND", layout_key="PA_BSND",
        sparse_count=sparse_count, sparse_mode=3)
    return idx


def test_a_hand_built_case_selects_the_lower_position_among_equal_scores():
    """One head, D = 1, q = w = 1: score[j] = relu(key[j]). Keys (-1, 2, 0, 2, -3, 1, 0):
    scores (0, 2, 0, 2, 0, 1, 0); two query rows of a 7-key request (sparse_mode 3: the
    first row sees keys 0..5, the second all 7)."""
    keys = [torch.tensor([-1.0, 2.0, 0.0, 2.0, -3.0, 1.0, 0.0]).view(7, 1, 1)]
    q, w = torch.ones(2, 1, 1), torch.ones(2, 1)
    got = _index(q, keys, w, [2], [7], 8, seed=0, block_size=4)
    assert got[:, 0].tolist() == [[1, 3, 5, 0, 2, 4, -1, -1],
                                  [1, 3, 5, 0, 2, 4, 6, -1]]
    got = _index(q, keys, w, [2], [7], 4, seed=1, block_size=4)
    assert got[:, 0].tolist() == [[1, 3, 5, 0], [1, 3, 5, 0]]
    got = _index(q, keys, w, [2], [7], 2, seed=2, block_size=4)     # a tie at the cut
    assert got[:, 0].tolist() == [[1, 3], [1, 3]]


def _request(seed, t=300, n=4, d=16):
    """Small integers (exact float sums): queries >= 0, keys mostly <= 0, so most scores
    are exactly 0 and the positive ones tie among themselves too."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 3, (t, n, d), generator=g).float()
    key = -torch.randint(0, 3, (t, 1, d), generator=g).float()
    pos = torch.rand(t, generator=g) < 0.1
    key[pos] = key[pos].abs()
    w = torch.randint(1, 3, (t, n), generator=g).float()
    return q.bfloat16(), key.bfloat16(), w.bfloat16()


def test_the_same_rows_select_the_same_keys_whole_or_in_two_chunks():
    t, split, k_sel = 300, 170, 64
    q, key, w = _request(0, t)
    whole = _index(q, [key], w, [t], [t], k_sel, seed=1)
    qf, kf, wf = q.float(), key[:, 0].float(), w.float()
    scores = (torch.relu(torch.einsum("thd,kd->thk", qf, kf)) * wf[..., None]).sum(1)
    visible = torch.arange(t)[None] <= torch.arange(t)[:, None]
    positive = ((scores > 0) & visible).sum(1)
    cut_in_zeros = (positive < k_sel) & (visible.sum(1) > k_sel)   # zeros tie at the cut
    assert int(cut_in_zeros.sum()) > 100                            # not a vacuous case
    # chunk 1 behind another request (its rows at other positions), chunk 2 alone
    g = torch.Generator().manual_seed(5)
    o_q = torch.randn(5, 4, 16, generator=g).bfloat16()
    o_k = torch.randn(7, 1, 16, generator=g).bfloat16()
    o_w = torch.rand(5, 4, generator=g).bfloat16()
    first = _index(torch.cat([o_q, q[:split]]), [o_k, key[:split]], torch.cat([o_w, w[:split]]),
                   [5, 5 + split], [7, split], k_sel, seed=2)[5:]
    second = _index(q[split:], [key], w[split:], [t - split], [t], k_sel, seed=3)
    chunked = torch.cat([first, second])
    assert torch.equal(chunked, whole)
    # and the rule itself: each row's indices are its scores descending, ties by position
    for r in (0, 63, 64, 65, 169, 170, 299):
        score = scores[r, :r + 1].tolist()
        order = sorted(range(r + 1), key=lambda j: (-score[j], j))[:k_sel]
        assert whole[r, 0].tolist() == order + [-1] * (k_sel - len(order)), r
