"""Engine runs computed once per test run: each distinct (script, arguments, environment)
runs once, on whichever pytest-xdist worker asks first, and every test that asks for it
reads its ``RESULT`` (``conftest.run_script``); the other worker, asking meanwhile, waits
for it instead of starting the same engine.

The results live in a folder made for the run (``E2E_ENGINE_CACHE``, set by the
controller in ``tests/conftest.py`` before the workers start, removed at the end), one
JSON file per key, written under a file lock. The folder also collects the engine starts
each run logged (vLLM's ``init engine`` line, one per engine core), which the run's
summary reports (``tests/conftest.py``). Without the variable (a script run outside
pytest) results are kept in the process only and starts are not recorded.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

ENV = "E2E_ENGINE_CACHE"
STARTS = "engine_starts.tsv"
ENGINE_LINE = "init engine (profile, create kv cache, warmup model) took"
# set per worker or per test by pytest, not by the run
_VOLATILE = ("PYTEST_", ENV)


def key(script: str, args: tuple, env: dict[str, str]) -> str:
    stable = {k: v for k, v in env.items() if not k.startswith(_VOLATILE)}
    text = json.dumps([script, list(args), sorted(stable.items())])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def engine_starts(text: str) -> int:
    """Engine cores that finished starting in a run's output."""
    return text.count(ENGINE_LINE)


class EngineCache:
    def __init__(self) -> None:
        self.memory: dict[str, dict] = {}

    @property
    def folder(self) -> Path | None:
        where = os.environ.get(ENV)
        return Path(where) if where and os.path.isdir(where) else None

    def get(self, k: str) -> dict | None:
        if k in self.memory:
            return self.memory[k]
        if self.folder is not None and (self.folder / f"{k}.json").exists():
            self.memory[k] = json.loads((self.folder / f"{k}.json").read_text())
            return self.memory[k]
        return None

    def get_or_compute(self, k: str, fresh: bool, compute: Callable[[], dict]) -> dict:
        """``k``'s result, ``compute()``d under ``k``'s file lock unless it is known (or
        ``fresh``): another worker asking for ``k`` meanwhile waits, then reads it. A
        ``compute`` that raises stores nothing."""
        if not fresh and (known := self.get(k)) is not None:
            return known
        folder = self.folder
        with contextlib.ExitStack() as stack:
            if folder is not None:
                lock = stack.enter_context(open(folder / f"{k}.lock", "w"))
                fcntl.flock(lock, fcntl.LOCK_EX)
            if not fresh and (known := self.get(k)) is not None:
                return known        # computed by the other worker while this one waited
            value = compute()
            self.memory[k] = value
            if folder is not None:
                tmp = folder / f"{k}.json.tmp"
                tmp.write_text(json.dumps(value))
                os.replace(tmp, folder / f"{k}.json")
            return value

    def count_starts(self, what: str, output: str) -> None:
        """Record the engines ``output`` started, under ``what`` (a script) and the test
        file that asked (pytest's ``PYTEST_CURRENT_TEST``)."""
        n = engine_starts(output)
        test = os.environ.get("PYTEST_CURRENT_TEST", "-").split("::", 1)[0]
        if self.folder is not None and n:
            with open(self.folder / STARTS, "a") as f:
                f.write(f"{test}\t{what}\t{n}\n")


CACHE = EngineCache()


def read_starts(folder: Path, by: int = 1) -> dict[str, int]:
    """Engine starts logged into ``folder``, per script (``by=1``) or per test file
    (``by=0``)."""
    out: dict[str, int] = {}
    path = folder / STARTS
    if path.exists():
        for line in path.read_text().splitlines():
            fields = line.split("\t")
            out[fields[by]] = out.get(fields[by], 0) + int(fields[-1])
    return out
