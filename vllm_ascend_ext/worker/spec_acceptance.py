"""Speculative decoding's acceptance per draft position, counted on the device and logged
once at shutdown beside the mixed-split summary.

vLLM's own spec-decode metrics are the engine's (Prometheus, periodic log lines). The
worker keeps its own count so that the end-of-run line names what this worker verified:
per step, the rejection sampler's output rows (``[requests, 1 + k]``, -1 after the first
rejected draft) add ``rows accepting a draft at position j`` to a device counter, one
comparison and one sum, no host read. Drafts and draft tokens come from the step's host
lists (``SpecDecodeMetadata.num_draft_tokens``). The counter is read at shutdown only.
"""

from __future__ import annotations

import torch
from vllm.logger import init_logger

logger = init_logger("vllm.ascend_ext")


class SpecAcceptance:
    """Drafts, draft tokens and accepted drafts per position for one runner."""

    def __init__(self, method: str, num_spec: int) -> None:
        self.method, self.num_spec = method, num_spec
        self.drafts = 0          # requests that carried at least one draft, over all steps
        self.draft_tokens = 0
        self._accepted: torch.Tensor | None = None   # device, [num_spec]
        self._final_logged = False

    def record(self, sampled_token_ids: torch.Tensor, num_draft_tokens: list[int]) -> None:
        """One verify step: ``sampled_token_ids`` ``[requests, 1 + k]`` (the rejection
        sampler's output, -1 for rejected positions), ``num_draft_tokens`` per request."""
        self.drafts += sum(1 for n in num_draft_tokens if n > 0)
        self.draft_tokens += sum(num_draft_tokens)
        width = min(sampled_token_ids.shape[1] - 1, self.num_spec)
        if width <= 0:
            return
        step = (sampled_token_ids[:, 1:1 + width] != -1).sum(dim=0)
        if self._accepted is None:
            self._accepted = torch.zeros(self.num_spec, dtype=torch.int64,
                                         device=sampled_token_ids.device)
        self._accepted[:width] += step

    def per_position(self) -> list[int]:
        """Accepted drafts per position (reads the device counter: shutdown only)."""
        if self._accepted is None:
            return [0] * self.num_spec
        return [int(v) for v in self._accepted.cpu()]

    def summary(self) -> str:
        per = self.per_position()
        accepted = sum(per)
        rate = accepted / self.draft_tokens if self.draft_tokens else 0.0
        mean_len = 1 + accepted / self.drafts if self.drafts else 1.0
        return (f"ascend_ext speculative decoding: method={self.method} drafts={self.drafts} "
                f"draft_tokens={self.draft_tokens} accepted={accepted} "
                f"acceptance={rate:.1%} per_position={per} mean_acceptance_length={mean_len:.2f}")

    def log_final(self) -> None:
        if not self._final_logged:
            self._final_logged = True
            logger.info(self.summary())
