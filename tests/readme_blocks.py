"""The fenced blocks of README.md and docs/*.md, their tags and expected outputs (used by
tests/ut and tests/e2e).

Every shell block starts with a tag line (see TAGS). A ``text`` block introduced by a
line ending in ``prints:`` (or ``prints, as its last line:``) is the expected output of
the command block before it: each of its lines must occur in that output, in order,
``...`` standing for anything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"

SETUP = "setup"        # verified against .ci/run; CI runs it
TESTS = "tests"        # the test command, verified against .ci/run; CI runs it
RUN = "run"            # must exit 0
SERVER = "server"      # runs in the background until the next non-client block
CLIENT = "client"      # runs while the server above is up
FAILS = "fails"        # must exit 2
SKIP = "skip"          # needs an NPU / illustration

# Tag line -> kind; the longest matching prefix wins.
TAGS = {
    "# runs on CPU: the set-up, exactly what .ci/run runs": SETUP,
    "# runs on CPU: the tests, exactly what .ci/run runs": TESTS,
    "# runs on CPU: starts a server (Ctrl-C stops it)": SERVER,
    "# runs on CPU, with the server above": CLIENT,
    "# runs on CPU: exits 2 on purpose": FAILS,
    "# runs on CPU": RUN,
    "# needs an NPU": SKIP,
    "# illustration": SKIP,
}
SHELL_LANGUAGES = ("bash", "sh", "shell", "console")
_FENCE = re.compile(r"^( *)```(\S*)[^\n]*\n(.*?)^\1```[ \t]*$", re.M | re.S)


@dataclass
class Block:
    line: int                       # 1-based line of the opening fence
    language: str
    text: str                       # dedented body
    kind: str | None = None         # for shell blocks
    expected: list[str] = field(default_factory=list)  # lines of a following "prints:" block
    expected_last_line: bool = False
    file: Path = README             # the file the block is in

    @property
    def command(self) -> str:
        return self.text

    @property
    def stem(self) -> str:
        return self.file.stem

    def where(self) -> str:
        return f"{relative(self.file)} line {self.line}"


def relative(path: Path) -> str:
    """``path`` as the repository names it (``README.md``, ``docs/fia.md``)."""
    try:
        return path.resolve().relative_to(REPO).as_posix()
    except ValueError:
        return str(path)


def doc_files() -> list[Path]:
    """README.md, then every ``docs/*.md`` in name order: the files whose blocks are tested."""
    return [README] + sorted(DOCS.glob("*.md"))


def all_docs_text() -> str:
    """README.md and every ``docs/*.md``, concatenated (for tables that must appear somewhere)."""
    return "\n".join(path.read_text() for path in doc_files())


def _dedent(body: str, indent: str) -> str:
    return "".join(line[len(indent):] if line.startswith(indent) else line
                   for line in body.splitlines(keepends=True))


def kind_of(text: str) -> str | None:
    first = text.lstrip("\n").splitlines()[0] if text.strip() else ""
    for tag in sorted(TAGS, key=len, reverse=True):
        if first.startswith(tag):
            return TAGS[tag]
    return None


def parse(text: str | None = None, path: Path = README) -> list[Block]:
    """The blocks of ``text`` (default: the file at ``path``, README.md)."""
    text = path.read_text() if text is None else text
    blocks: list[Block] = []
    for m in _FENCE.finditer(text):
        indent, language, body = m.group(1), m.group(2), m.group(3)
        line = text.count("\n", 0, m.start()) + 1
        block = Block(line, language, _dedent(body, indent), file=path)
        if language in SHELL_LANGUAGES or language == "":
            block.kind = kind_of(block.text)
        intro = text[:m.start()].rstrip().splitlines()[-1] if m.start() else ""
        shell = [b for b in blocks if b.kind is not None]
        if language == "text" and intro.endswith(":") and "prints" in intro and shell:
            shell[-1].expected = [ln for ln in block.text.splitlines() if ln.strip()]
            shell[-1].expected_last_line = "last line" in intro
        blocks.append(block)
    return blocks


def parse_all() -> list[Block]:
    """The blocks of README.md and every ``docs/*.md``, file by file (see ``doc_files``)."""
    return [block for path in doc_files() for block in parse(path=path)]


def untagged(blocks: list[Block]) -> list[Block]:
    """Command blocks (shell or no language) that carry no tag."""
    return [b for b in blocks if (b.language in SHELL_LANGUAGES or b.language == "")
            and b.kind is None]


def output_mismatch(block: Block, output: str) -> str | None:
    """None if ``output`` shows the block's expected lines, else what is missing."""
    lines = output.splitlines()
    if block.expected_last_line:
        want = block.expected[-1]
        last = lines[-1] if lines else ""
        return None if _pattern(want).fullmatch(last.strip()) else (
            f"last line {last!r} is not {want!r}")
    pos = 0
    for want in block.expected:
        pattern = _pattern(want)
        while pos < len(lines) and not pattern.search(lines[pos]):
            pos += 1
        if pos == len(lines):
            return f"expected line {want!r} not found (in order) in the output"
        pos += 1
    return None


def _pattern(line: str) -> re.Pattern:
    return re.compile(".*".join(re.escape(part) for part in line.strip().split("...")))


# vLLM 0.32's own shutdown race, in drain mode too: the API server stops its engine client
# in an executor thread (entrypoints/launchers/launcher.py), which cancels the client's
# output-queue task (v1/engine/core_client.py, "cleaning up background resources") before
# AsyncLLM.shutdown cancels the output handler; when the event loop runs in between, the
# handler reads the EngineDeadError the cancelled task queued and logs it. By then every
# request has finished and the engine has stopped ("MPClient: complete").
_SHUTDOWN_DONE = "[shutdown] MPClient: complete"
_HANDLER_LINE = re.compile(r"^\(APIServer pid=\d+\) ERROR .*\[async_llm\.py:\d+\] ")


def without_vllm_shutdown_race(log: str) -> str:
    """``log`` less vLLM's output-handler EngineDeadError block logged after the engine stopped.

    Only a block that starts with ``AsyncLLM output_handler failed.`` after the
    ``MPClient: complete`` line, whose lines all
    come from ``async_llm.py`` and whose last line is the ``EngineDeadError``, is removed;
    anything else (another traceback, one before the engine stopped) stays.
    """
    lines = log.splitlines(keepends=True)
    done = next((i for i, ln in enumerate(lines) if _SHUTDOWN_DONE in ln), None)
    if done is None:
        return log
    start = next((i for i in range(done + 1, len(lines)) if _HANDLER_LINE.match(lines[i])
                  and lines[i].rstrip().endswith("AsyncLLM output_handler failed.")), None)
    if start is None:
        return log
    end = start + 1
    while end < len(lines) and _HANDLER_LINE.match(lines[end]):
        end += 1
    if "vllm.v1.engine.exceptions.EngineDeadError: " not in lines[end - 1]:
        return log
    return "".join(lines[:start] + lines[end:])
