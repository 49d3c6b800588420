"""Per-engine counters of the mixed-step split, logged as one INFO line."""

from __future__ import annotations

import time
from collections import Counter

from vllm.logger import init_logger

logger = init_logger("vllm.ascend_ext")

LOG_INTERVAL_S = 30.0


class SplitStats:
    """Mixed steps seen / split / declined by reason. Owned by a metadata builder."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.mixed = 0
        self.split = 0
        self.declined: Counter[str] = Counter()
        self._last_log = time.monotonic()
        self._final_logged = False

    def record(self, split: bool, reason: str) -> None:
        self.mixed += 1
        if split:
            self.split += 1
        else:
            self.declined[reason] += 1

    def summary(self) -> str:
        declined = ", ".join(f"{r}: {n}" for r, n in sorted(self.declined.items())) or "none"
        return (f"ascend_ext mixed-split: group={self.group} mixed_steps={self.mixed} "
                f"split={self.split} declined={sum(self.declined.values())} ({declined})")

    def maybe_log(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if self.mixed and now - self._last_log >= LOG_INTERVAL_S:
            self._last_log = now
            logger.info(self.summary())

    def log_final(self) -> None:
        """The end-of-run line, logged once (worker shutdown, else garbage collection)."""
        if not self._final_logged:
            self._final_logged = True
            logger.info(self.summary())
