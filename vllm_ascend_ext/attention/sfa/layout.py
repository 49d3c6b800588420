"""One SFA layer's paged cache: every token row holds latent | rope | indexer key.

vLLM allocates one tensor per attention layer. The SFA layer keeps the three
per-token vectors the NPU kernels read (``c^KV`` [Hckv], ``k_r`` [Dr], indexer key
[Di]) side by side in one row of width ``Hckv + Dr + Di`` (704 for DeepSeek-V3.2),
so one slot index, one block table and one cache group serve all of them, and a
KV transfer moves whole rows. The kernels get ``[num_blocks, block_size, 1, D]``
views into that row (strided across tokens; see README for the NPU caveat).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SfaRow:
    latent: int      # kv_lora_rank (Hckv)
    rope: int        # qk_rope_head_dim (Dr)
    index_key: int   # index_head_dim (Di)

    @property
    def width(self) -> int:
        return self.latent + self.rope + self.index_key

    def rows(self, kv_cache: torch.Tensor) -> torch.Tensor:
        """The bound cache as [num_blocks, block_size, width]."""
        if kv_cache.dim() == 4:          # [num_blocks, 1 (kv heads), block_size, width]
            kv_cache = kv_cache.squeeze(1)
        if kv_cache.dim() != 3 or kv_cache.shape[-1] != self.width:
            raise ValueError(
                f"SFA cache must be [num_blocks, block_size, {self.width}], got "
                f"{tuple(kv_cache.shape)}"
            )
        return kv_cache

    def views(self, kv_cache: torch.Tensor):
        """(latent, rope, index_key) as paged [num_blocks, block_size, 1, D] views."""
        r = self.rows(kv_cache).unsqueeze(2)
        a, b = self.latent, self.latent + self.rope
        return r[..., :a], r[..., a:b], r[..., b:]
