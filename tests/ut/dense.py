"""Independent dense attention and paged-cache helpers for the operator tests.

Written from the math (explicit per-request, per-row loops), sharing no code with
the plugin's reference operators.
"""

from __future__ import annotations

import contextlib
import math
import os
import random

import torch


def dense_attention(q, k, v, scale, visible):
    """One request. q [Lq,Nq,D], k/v [Lkv,Nkv,D]; visible(i, j) -> bool.

    Returns (out [Lq,Nq,Dv] fp32, lse [Lq,Nq] fp32). Rows that see nothing give 0.
    """
    Lq, Nq, _ = q.shape
    Lkv, Nkv, Dv = v.shape
    G = Nq // Nkv
    out = torch.zeros(Lq, Nq, Dv, dtype=torch.float64)
    lse = torch.full((Lq, Nq), float("-inf"), dtype=torch.float64)
    for i in range(Lq):
        cols = [j for j in range(Lkv) if visible(i, j)]
        if not cols:
            continue
        for h in range(Nq):
            kh = k[cols, h // G].double()
            vh = v[cols, h // G].double()
            s = (kh @ q[i, h].double()) * scale
            m = s.max()
            p = torch.exp(s - m)
            z = p.sum()
            out[i, h] = (p / z) @ vh
            lse[i, h] = m + math.log(z.item())
    return out.float(), lse.float()


def write_paged(seq_k, seq_v, block_size, num_blocks, rng: random.Random, dtype):
    """Scatter per-request K/V sequences into a paged cache under a random block table.

    seq_k/seq_v: lists of [L_b, Nkv, D]. Returns (key_cache, value_cache,
    block_table int32 [B, max_blocks]) with caches [num_blocks, block_size, Nkv, D];
    unused cache rows hold large garbage so a wrong gather shows.
    """
    nkv, d = seq_k[0].shape[1], seq_k[0].shape[2]
    kc = torch.full((num_blocks, block_size, nkv, d), 1e3).to(dtype)
    vc = torch.full((num_blocks, block_size, nkv, d), -1e3).to(dtype)
    need = [max(1, -(-k.shape[0] // block_size)) for k in seq_k]
    free = list(range(num_blocks))
    rng.shuffle(free)
    width = max(need)
    table = torch.zeros(len(seq_k), width, dtype=torch.int32)
    for b, (k, v) in enumerate(zip(seq_k, seq_v)):
        for n in range(need[b]):
            blk = free.pop()
            table[b, n] = blk
            lo, hi = n * block_size, min((n + 1) * block_size, k.shape[0])
            if hi > lo:
                kc[blk, : hi - lo] = k[lo:hi].to(dtype)
                vc[blk, : hi - lo] = v[lo:hi].to(dtype)
    return kc, vc, table


@contextlib.contextmanager
def emulation_path(path: str):
    """Run the block with the compiled emulation kernels (``compiled``) or with the Python
    references forced (``reference``, ``ASCEND_EXT_PY_REFERENCE=1``)."""
    old = os.environ.get("ASCEND_EXT_PY_REFERENCE")
    os.environ["ASCEND_EXT_PY_REFERENCE"] = "1" if path == "reference" else "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("ASCEND_EXT_PY_REFERENCE", None)
        else:
            os.environ["ASCEND_EXT_PY_REFERENCE"] = old
