"""Independent dense attention and paged-cache helpers for the operator tests.

Written from the math (explicit per-request, per-row loops), sharing no code with
the plugin's reference operators.
"""

from __future__ import annotations

import contextlib
import os
import random

import torch


def dense_attention(q, k, v, scale, visible):
    """One request. q [Lq,Nq,D], k/v [Lkv,Nkv,D]; visible(i, j) -> bool.

    Returns (out [Lq,Nq,Dv] fp32, lse [Lq,Nq] fp32). Rows that see nothing give 0.
    Float64 softmax over an explicit visibility matrix, every head at once (the math of
    one row: s = K q * scale, p = exp(s - max s), out = p V / sum p, lse = max s + log sum p).
    """
    Lq, Nq, _ = q.shape
    Lkv, Nkv, Dv = v.shape
    G = Nq // Nkv
    mask = torch.tensor([[bool(visible(i, j)) for j in range(Lkv)] for i in range(Lq)],
                        dtype=torch.bool).reshape(Lq, Lkv)
    kh = k.double().repeat_interleave(G, dim=1)                  # [Lkv, Nq, D]: head h -> h // G
    vh = v.double().repeat_interleave(G, dim=1)
    s = torch.einsum("ihd,jhd->hij", q.double(), kh) * scale     # [Nq, Lq, Lkv]
    s = s.masked_fill(~mask, float("-inf"))
    m = s.amax(dim=-1, keepdim=True)                              # -inf where nothing is visible
    seen = mask.any(dim=-1)                                       # [Lq]
    p = torch.exp(s - torch.where(torch.isfinite(m), m, torch.zeros_like(m)))
    z = p.sum(dim=-1, keepdim=True)
    out = torch.einsum("hij,jhd->ihd", p / z.clamp_min(1e-300), vh)
    lse = (m + torch.log(z)).squeeze(-1).transpose(0, 1)         # [Lq, Nq]
    out[~seen] = 0
    lse[~seen] = float("-inf")
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
