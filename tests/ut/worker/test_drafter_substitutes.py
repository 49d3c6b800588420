"""The NPU's substitutes of vLLM's drafter input kernels (``worker/drafter_substitutes.py``)
against loops written from the Triton kernels (``vllm/v1/spec_decode/utils.py``), one
iteration per kernel program and token, and against vLLM's own C++ CPU implementations;
then launched through vLLM's own wrappers once registered. Random ragged batches: prompts
and drafts of different lengths, rejected tokens, discarded requests, -1 and out-of-vocab
samples, positions at ``max_model_len``, graph padding rows. Untouched buffer regions keep
a sentinel. Negative controls: two mutants differ from the loops."""

from __future__ import annotations

import random

import pytest
import torch

from vllm_ascend_ext.worker import drafter_substitutes as ds

SEEDS = range(10)
SENTINEL = -5


# -- loops, one kernel program at a time -------------------------------------------------

def _loop_step(positions, table, seq_lens, block_size, max_len, padded, pad=-1):
    b = len(positions)
    out_pos, out_slot, new_seq = [None] * b, [pad] * padded, list(seq_lens)
    for r in range(b):
        new = positions[r] + 1
        exceeds = new >= max_len
        clamped = 0 if exceeds else new
        block = min(clamped // block_size, len(table[r]) - 1)
        out_slot[r] = pad if exceeds else table[r][block] * block_size + clamped % block_size
        out_pos[r] = clamped
        new_seq[r] = min(1 if exceeds else seq_lens[r] + 1, max_len)
    return out_pos, out_slot, new_seq


def _loop_prepare_inputs(cu, valid, qsl):
    idx, rej = [], []
    for r in range(len(cu)):
        drafts = cu[r] - (cu[r - 1] if r else 0)
        rejected = drafts + 1 - valid[r] if drafts > 0 else 0
        idx.append(qsl[r + 1] - 1 - rejected)
        rej.append(rejected)
    return idx, rej


def _loop_next_token(sampled, discard, backup, vocab):
    nxt, cnt = [], []
    for r, row in enumerate(sampled):
        if discard[r]:
            nxt.append(backup[r])
            cnt.append(0)
            continue
        valid = [i for i, t in enumerate(row) if t != -1 and t < vocab]
        nxt.append(row[valid[-1]] if valid else backup[r])
        cnt.append(len(valid))
    return nxt, cnt


def _loop_copy_expand(ids, pos, nxt, qsl, qend, pad_id, par_id, pslots, shift, size):
    out = {k: [SENTINEL] * size for k in ("ids", "pos", "rej", "mask")}
    new_idx = [SENTINEL] * (len(qend) * pslots)
    hmap = [SENTINEL] * len(ids)
    for r in range(len(qend)):
        qs, nqs, qe = qsl[r], qsl[r + 1], qend[r]
        if shift:
            nvalid, off, start = qe - qs, 1, qs + r * (pslots - 1)
        else:
            nvalid, off, start = qe - qs + 1, 0, qs + r * pslots
        total = nvalid + pslots + (nqs - qe - 1)
        for j in range(total):
            o = start + j
            if j < nvalid:
                tok = ids[min(qs + off + j, len(ids) - 1)]
            elif j == nvalid and pslots > 0:
                tok = nxt[r]
            elif j < nvalid + pslots:
                tok = par_id
            else:
                tok = pad_id
            rejected = j >= nvalid + pslots
            out["ids"][o] = tok
            out["pos"][o] = 0 if rejected else pos[qs] + j
            out["rej"][o] = int(rejected)
            out["mask"][o] = int(nvalid < j < nvalid + pslots)
            if nvalid <= j < nvalid + pslots:
                new_idx[r * pslots + j - nvalid] = o
        if shift:
            for j in range(nqs - qs):
                hmap[qs + j] = start + j
    return out, new_idx, hmap


def _loop_dflash(nxt, pos, table, qsl, rejected, par_id, block_size, q, k, sizes):
    width = len(table[0])
    ctx_pos, ctx_slot = [SENTINEL] * sizes, [SENTINEL] * sizes
    ids, qpos, qslot = ([SENTINEL] * sizes for _ in range(3))
    sample = [SENTINEL] * sizes

    def slot(r, p):
        return table[r][min(p // block_size, width - 1)] * block_size + p % block_size

    for r in range(len(qsl) - 1):
        s, e = qsl[r], qsl[r + 1]
        last = pos[e - (rejected[r] if rejected is not None else 0) - 1]
        for j in range(e - s):
            p = pos[min(s + j, len(pos) - 1)]
            ctx_pos[s + j], ctx_slot[s + j] = p, slot(r, p)
        for i in range(q):
            p = last + 1 + i
            qpos[r * q + i], qslot[r * q + i] = p, slot(r, p)
            ids[r * q + i] = nxt[r] if i == 0 else par_id
            if i > 0:
                sample[r * k + i - 1] = r * q + i
    return ctx_pos, ctx_slot, ids, qpos, qslot, sample


# -- random cases --------------------------------------------------------------------------

def _ragged(rng, b, max_len=6):
    lens = [rng.randint(1, max_len) for _ in range(b)]
    qsl = [0]
    for n in lens:
        qsl.append(qsl[-1] + n)
    return lens, qsl


def _step_case(seed):
    rng = random.Random(seed)
    b, block_size, max_len = rng.randint(1, 6), rng.choice([4, 16]), rng.choice([40, 64])
    width = -(-max_len // block_size)
    table = [[rng.randint(0, 50) for _ in range(width)] for _ in range(b)]
    positions = [rng.choice([max_len - 1, max_len - 2, rng.randint(0, max_len - 1)])
                 for _ in range(b)]
    seq = [p + 1 for p in positions]
    return b, block_size, max_len, table, positions, seq, b + rng.randint(0, 3)


@pytest.mark.parametrize("seed", SEEDS)
def test_step_slot_mapping_equals_the_loop(seed):
    b, bs, max_len, table, positions, seq, padded = _step_case(seed)
    pos_t = torch.tensor(positions)
    out_pos = torch.full((b,), SENTINEL, dtype=torch.int64)
    out_slot = torch.full((padded,), SENTINEL, dtype=torch.int64)
    seq_t = torch.tensor(seq, dtype=torch.int32)
    ds.eagle_step_slot_mapping_metadata(pos_t, torch.tensor(table, dtype=torch.int32),
                                        len(table[0]), seq_t, out_pos, out_slot, bs, max_len,
                                        len(table[0]), -1, b)
    want = _loop_step(positions, table, seq, bs, max_len, padded)
    assert (out_pos.tolist(), out_slot.tolist(), seq_t.tolist()) == want


def test_step_reads_positions_before_writing_them():
    """The proposer passes the positions buffer as both input and output."""
    buf = torch.tensor([3, 7, 0])
    slot = torch.empty(2, dtype=torch.int64)
    ds.eagle_step_slot_mapping_metadata(buf[:2], torch.tensor([[9, 8], [7, 6]]), 2,
                                        torch.tensor([4, 8], dtype=torch.int32), buf[:2], slot,
                                        4, 100, 2, -1, 2)
    assert buf.tolist() == [4, 8, 0] and slot.tolist() == [8 * 4 + 0, 6 * 4 + 0]


@pytest.mark.parametrize("seed", SEEDS)
def test_prepare_inputs_padded_equals_the_loop(seed):
    rng = random.Random(seed)
    b = rng.randint(1, 6)
    drafts = [rng.choice([0, 1, 3]) for _ in range(b)]
    cu = list(torch.tensor(drafts).cumsum(0).tolist())
    valid = [rng.randint(1, d + 1) if d else rng.choice([0, 1]) for d in drafts]
    _, qsl = _ragged(rng, b)
    qsl = [q + sum(drafts[:i]) for i, q in enumerate(qsl)]
    idx = torch.full((b + 2,), SENTINEL, dtype=torch.int32)
    rej = torch.full((b + 2,), SENTINEL, dtype=torch.int32)
    ds.eagle_prepare_inputs_padded(torch.tensor(cu, dtype=torch.int32),
                                   torch.tensor(valid, dtype=torch.int32),
                                   torch.tensor(qsl, dtype=torch.int32), idx, rej, b)
    want_idx, want_rej = _loop_prepare_inputs(cu, valid, qsl)
    assert idx.tolist() == want_idx + [SENTINEL] * 2
    assert rej.tolist() == want_rej + [SENTINEL] * 2


def _next_token_case(seed, vocab=50):
    rng = random.Random(seed)
    b, width = rng.randint(1, 6), rng.randint(1, 4)
    sampled = [[rng.choice([-1, rng.randint(0, vocab - 1), vocab + 3]) for _ in range(width)]
               for _ in range(b)]
    discard = [rng.random() < 0.3 for _ in range(b)]
    backup = [rng.randint(0, vocab - 1) for _ in range(b)]
    return b, width, sampled, discard, backup, vocab


@pytest.mark.parametrize("seed", SEEDS)
def test_prepare_next_token_padded_equals_the_loop(seed):
    b, width, sampled, discard, backup, vocab = _next_token_case(seed)
    # a strided row view, as the runner's sampled-token buffer is wider than the drafts
    wide = torch.full((b, width + 2), 77, dtype=torch.int32)
    wide[:, :width] = torch.tensor(sampled, dtype=torch.int32)
    nxt = torch.full((b,), SENTINEL, dtype=torch.int32)
    cnt = torch.full((b,), SENTINEL, dtype=torch.int32)
    ds.eagle_prepare_next_token_padded(wide[:, :width], torch.tensor(discard),
                                       torch.tensor(backup, dtype=torch.int32), nxt, cnt,
                                       vocab, width, b, width + 2)
    assert (nxt.tolist(), cnt.tolist()) == _loop_next_token(sampled, discard, backup, vocab)


def _copy_case(seed):
    rng = random.Random(seed)
    b = rng.randint(1, 5)
    lens, qsl = _ragged(rng, b)
    qend = [qsl[r + 1] - 1 - rng.randint(0, lens[r] - 1) for r in range(b)]
    n = qsl[-1]
    ids = [rng.randint(0, 99) for _ in range(n)]
    pos = []
    for r in range(b):
        first = rng.randint(0, 30)
        pos += list(range(first, first + lens[r]))
    nxt = [rng.randint(100, 199) for _ in range(b)]
    return b, qsl, qend, ids, pos, nxt, rng.randint(1, 3), rng.random() < 0.5


def _run_copy(fn, case):
    b, qsl, qend, ids, pos, nxt, pslots, shift = case
    n = qsl[-1]
    size = n + b * pslots + 4
    out = {k: torch.full((size,), SENTINEL, dtype=dt) for k, dt in
           (("ids", torch.int32), ("pos", torch.int64), ("rej", torch.int8),
            ("mask", torch.int8))}
    new_idx = torch.full((b * pslots,), SENTINEL, dtype=torch.int32)
    hmap = torch.full((n,), SENTINEL, dtype=torch.int32)
    rej, mask = out["rej"].to(torch.bool), out["mask"].to(torch.bool)
    fn(torch.tensor(ids, dtype=torch.int32), torch.tensor(pos), torch.tensor(nxt, dtype=torch.int32),
       out["ids"], out["pos"], rej, mask, new_idx, hmap, torch.tensor(qsl, dtype=torch.int32),
       torch.tensor(qend, dtype=torch.int32), 0, 999, n, pslots, shift)
    return out, rej, mask, new_idx, hmap, size


@pytest.mark.parametrize("seed", range(16))
def test_copy_and_expand_eagle_inputs_equals_the_loop(seed):
    case = _copy_case(seed)
    b, qsl, qend, ids, pos, nxt, pslots, shift = case
    out, rej, mask, new_idx, hmap, size = _run_copy(ds.copy_and_expand_eagle_inputs, case)
    want, want_new, want_map = _loop_copy_expand(ids, pos, nxt, qsl, qend, 0, 999, pslots,
                                                 shift, size)
    assert out["ids"].tolist() == want["ids"] and out["pos"].tolist() == want["pos"]
    written = [v != SENTINEL for v in want["rej"]]
    assert [int(v) for v, w in zip(rej.tolist(), written) if w] == \
        [v for v in want["rej"] if v != SENTINEL]
    assert [int(v) for v, w in zip(mask.tolist(), written) if w] == \
        [v for v in want["mask"] if v != SENTINEL]
    assert new_idx.tolist() == want_new and hmap.tolist() == want_map


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("has_rejected", [False, True])
def test_copy_and_expand_dflash_inputs_equals_the_loop(seed, has_rejected):
    rng = random.Random(seed)
    b, bs, k = rng.randint(1, 5), rng.choice([4, 8]), rng.randint(1, 3)
    q = k + 1
    lens, qsl = _ragged(rng, b)
    pos = []
    for r in range(b):
        first = rng.randint(0, 20)
        pos += list(range(first, first + lens[r]))
    width = 5
    table = [[rng.randint(0, 40) for _ in range(width)] for _ in range(b)]
    rejected = [rng.randint(0, lens[r] - 1) for r in range(b)] if has_rejected else None
    nxt = [rng.randint(100, 199) for _ in range(b)]
    size = qsl[-1] + b * q + 3
    bufs = [torch.full((size,), SENTINEL, dtype=dt) for dt in
            (torch.int64, torch.int64, torch.int32, torch.int64, torch.int64, torch.int32)]
    ctx_pos, ctx_slot, ids, qpos, qslot, sample = bufs
    table_t = torch.tensor(table, dtype=torch.int32)
    ds.copy_and_expand_dflash_inputs(
        torch.tensor(nxt, dtype=torch.int32), torch.tensor(pos), ids, ctx_pos, qpos, ctx_slot,
        qslot, sample, table_t, table_t.stride(0), torch.tensor(qsl, dtype=torch.int32),
        torch.tensor(rejected, dtype=torch.int32) if has_rejected else 0, 999, bs, q, k,
        qsl[-1], HAS_NUM_REJECTED=has_rejected)
    want = _loop_dflash(nxt, pos, table, qsl, rejected, 999, bs, q, k, size)
    assert [t.tolist() for t in (ctx_pos, ctx_slot, ids, qpos, qslot, sample)] == list(want)


# -- vLLM's own CPU kernels, and vLLM's wrappers ----------------------------------------------

@pytest.mark.parametrize("seed", SEEDS[:4])
def test_substitutes_agree_with_vllms_cpu_kernels(seed):
    import vllm._C  # noqa: F401 - registers the CPU kernels
    from vllm.utils import cpu_triton_utils as cpu

    b, bs, max_len, table, positions, seq, _ = _step_case(seed)
    table_t = torch.tensor(table, dtype=torch.int32)
    results = []
    for fn in (ds.eagle_step_slot_mapping_metadata,
               cpu._eagle_step_slot_mapping_metadata_kernel_impl):
        pos_o, slot_o = torch.empty(b, dtype=torch.int64), torch.empty(b, dtype=torch.int64)
        seq_t = torch.tensor(seq, dtype=torch.int32)
        fn(torch.tensor(positions), table_t, len(table[0]), seq_t, pos_o, slot_o, bs, max_len,
           len(table[0]), -1, b)
        results.append((pos_o.tolist(), slot_o.tolist(), seq_t.tolist()))
    assert results[0] == results[1]

    b, width, sampled, discard, backup, vocab = _next_token_case(seed)
    results = []
    for fn in (ds.eagle_prepare_next_token_padded, cpu._eagle_prepare_next_token_padded_kernel_impl):
        nxt, cnt = torch.empty(b, dtype=torch.int32), torch.empty(b, dtype=torch.int32)
        fn(torch.tensor(sampled, dtype=torch.int32), torch.tensor(discard),
           torch.tensor(backup, dtype=torch.int32), nxt, cnt, vocab, width, b, width)
        results.append((nxt.tolist(), cnt.tolist()))
    assert results[0] == results[1]

    case = _copy_case(seed)
    mine = _run_copy(ds.copy_and_expand_eagle_inputs, case)
    theirs = _run_copy(cpu._copy_and_expand_eagle_inputs_kernel_impl, case)
    for a, c in zip(mine[:-1], theirs[:-1]):
        for x, y in (zip(a.values(), c.values()) if isinstance(a, dict) else [(a, c)]):
            assert torch.equal(x, y)


def test_vllms_wrappers_launch_the_registered_substitutes():
    """Registered as the platform registers them, vLLM's own launch wrappers (grid, keyword
    launch, graph padding) reach the substitutes and produce the loops' values."""
    from vllm.triton_utils.dispatcher import _registry
    from vllm.v1.spec_decode import utils as su

    from vllm_ascend_ext.emulation.platform import EmulatedAscendPlatform

    EmulatedAscendPlatform.register_triton_kernel_overrides()
    for name, impl in ds.SUBSTITUTES.items():
        assert _registry[name][1] is impl, name
    b, bs, max_len, table, positions, seq, padded = _step_case(3)
    out_pos = torch.empty(b, dtype=torch.int64)
    out_slot = torch.full((padded,), SENTINEL, dtype=torch.int64)
    seq_t = torch.tensor(seq, dtype=torch.int32)
    su.eagle_step_update_slot_mapping_and_metadata(
        torch.tensor(positions), torch.tensor(table, dtype=torch.int32), seq_t, bs, max_len,
        out_pos, out_slot, input_batch_size=padded)
    assert (out_pos.tolist(), out_slot.tolist(), seq_t.tolist()) == \
        _loop_step(positions, table, seq, bs, max_len, padded)
    idx, rej = torch.empty(2, dtype=torch.int32), torch.empty(2, dtype=torch.int32)
    su._eagle_prepare_inputs_padded(torch.tensor([2, 2], dtype=torch.int32),
                                    torch.tensor([1, 1], dtype=torch.int32),
                                    torch.tensor([0, 3, 4], dtype=torch.int32), idx, rej, 2)
    assert (idx.tolist(), rej.tolist()) == ([0, 3], [2, 0])


# -- negative controls ---------------------------------------------------------------------------

def test_negative_controls_two_mutants_differ_from_the_loops():
    def no_graph_padding(*args):
        out_slot = args[5]
        keep = out_slot.clone()
        ds.eagle_step_slot_mapping_metadata(*args)
        b = args[-1]
        out_slot[b:] = keep[b:]

    def rejections_without_drafts(cu, valid, qsl, idx, rej, n):
        ds.eagle_prepare_inputs_padded(cu, valid, qsl, idx, rej, n)
        drafts = cu.to(torch.int64) - torch.cat([cu.new_zeros(1), cu[:-1]]).to(torch.int64)
        rej[:n] = (drafts + 1 - valid.to(torch.int64)).to(rej.dtype)

    step_differs = prep_differs = 0
    for seed in SEEDS:
        b, bs, max_len, table, positions, seq, padded = _step_case(seed)
        out_slot = torch.full((padded,), SENTINEL, dtype=torch.int64)
        no_graph_padding(torch.tensor(positions), torch.tensor(table, dtype=torch.int32),
                         len(table[0]), torch.tensor(seq, dtype=torch.int32),
                         torch.empty(b, dtype=torch.int64), out_slot, bs, max_len,
                         len(table[0]), -1, b)
        step_differs += out_slot.tolist() != _loop_step(positions, table, seq, bs, max_len,
                                                         padded)[1]
        cu = torch.tensor([0, 2], dtype=torch.int32)
        valid = torch.tensor([seed % 2, 2], dtype=torch.int32)
        idx, rej = torch.empty(2, dtype=torch.int32), torch.empty(2, dtype=torch.int32)
        rejections_without_drafts(cu, valid, torch.tensor([0, 1, 4], dtype=torch.int32), idx,
                                  rej, 2)
        prep_differs += rej.tolist() != _loop_prepare_inputs([0, 2], valid.tolist(), [0, 1, 4])[1]
    assert step_differs > 0 and prep_differs > 0
