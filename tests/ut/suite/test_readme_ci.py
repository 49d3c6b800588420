"""The documentation's structure (README.md and docs/*.md): tagged command blocks, the
set-up that .ci/run runs, tables that mirror the code, links that resolve, a README short
enough to be a front door. Executing the CPU blocks: tests/e2e/test_readme_commands.py."""

from __future__ import annotations

import re
from pathlib import Path

from tests import readme_blocks as rb
from vllm_ascend_ext.config import schema_rows
from vllm_ascend_ext.platform import soc

REPO = Path(__file__).resolve().parents[3]


def test_every_command_block_carries_a_tag():
    files = rb.doc_files()
    assert files[0] == rb.README and len(files) > 1  # README, then docs/*.md
    blocks = rb.parse_all()
    assert not [b.where() for b in rb.untagged(blocks)]
    kinds = [b.kind for b in blocks if b.kind]
    assert kinds.count(rb.SETUP) == 1 and rb.SERVER in kinds and rb.SKIP in kinds
    # A client block needs a server block before it in the same file, with no other kind
    # in between.
    for path in files:
        current = None
        for b in rb.parse(path=path):
            if b.kind == rb.SERVER:
                current = b
            elif b.kind == rb.CLIENT:
                assert current is not None, f"{b.where()}: client block without a server above"
            elif b.kind is not None:
                current = None


def test_ci_runs_exactly_readme_install_and_test_commands():
    def commands(kind):
        blocks = [b for b in rb.parse_all() if b.kind == kind]
        assert len(blocks) == 1 and blocks[0].file == rb.README, kind  # README's, verbatim
        return [ln for ln in blocks[0].text.splitlines() if ln.strip() and not ln.startswith("#")]

    # two steps: the install, then the tests
    (install,), (test,) = commands(rb.SETUP), commands(rb.TESTS)
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.startswith(("#", "set ", "cd ", "start=", "trap "))]
    assert ci == [install, test]
    assert "pytest" in test and "pip install" in install


def test_the_block_parser_finds_tags_outputs_and_untagged_blocks():
    text = ("```bash\n# runs on CPU\necho hi\n```\n\nprints:\n\n```text\nh...\n```\n\n"
            "  ```bash\n  # needs an NPU\n  npu-smi info\n  ```\n\n```\nls\n```\n\n"
            "```bash\n# runs on CPU: exits 2 on purpose\nfalse\n```\n\nprints, as its last line:"
            "\n\n```text\nerror: x\n```\n")
    blocks = rb.parse(text)
    shell = [b for b in blocks if b.language != "text"]
    assert [b.kind for b in shell] == [rb.RUN, rb.SKIP, None, rb.FAILS]
    assert shell[1].text == "# needs an NPU\nnpu-smi info\n"
    assert [b.line for b in rb.untagged(blocks)] == [shell[2].line]
    assert shell[0].expected == ["h..."] and not shell[0].expected_last_line
    assert rb.output_mismatch(shell[0], "x\nhello\n") is None
    assert rb.output_mismatch(shell[0], "x\n") is not None
    assert shell[3].expected_last_line
    assert rb.output_mismatch(shell[3], "log\nerror: x\n") is None
    assert rb.output_mismatch(shell[3], "error: x\nmore\n") is not None
    assert shell[0].where() == "README.md line 1"
    doc = rb.parse(text, path=rb.DOCS / "quickstart-cpu.md")
    assert doc[0].where() == "docs/quickstart-cpu.md line 1" and doc[0].stem == "quickstart-cpu"


def test_readme_config_table_matches_the_schema():
    text = (REPO / "README.md").read_text()
    for key, allowed, meaning in schema_rows():
        assert f"| `{key}` | {allowed.replace('|', chr(92) + '|')} | {meaning} |" in text, key


def test_readme_environment_table_is_the_codes():
    """README's rows of ASCEND_EXT_ variables are exactly envs.table_rows(), in order, and
    every variable the package reads through envs (a constant there) is documented."""
    import re

    from vllm_ascend_ext import envs

    text = (REPO / "README.md").read_text()
    rows = [ln for ln in text.splitlines() if re.match(r"\| `ASCEND_EXT_\w+` \| ", ln)]
    assert rows == envs.table_rows()
    named = {v for v in vars(envs).values() if isinstance(v, str)
             and re.fullmatch(r"ASCEND_EXT_[A-Z_]+", v)}
    assert named == set(envs.DOCUMENTED)


def test_readme_soc_table_is_every_soc_the_code_knows():
    text = (REPO / "README.md").read_text()
    for chip in soc.known():
        served = "yes" if chip.family in soc.SUPPORTED_FAMILIES else "no: refused at startup"
        assert f"| `{chip.name}` | {chip.family} | {chip.version} | {served} |" in text, chip
    for alias, name in soc.aliases().items():
        assert f"`{alias}`" in text and soc.from_name(alias).name == name


README_MAX_LINES = 350


def test_readme_is_a_front_door():
    lines = (REPO / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move detail into docs/"
    # Every docs page is reachable from README's reading list.
    text = (REPO / "README.md").read_text()
    for path in sorted((REPO / "docs").glob("*.md")):
        assert f"](docs/{path.name})" in text, path.name


def test_all_docs_text_holds_readme_and_every_docs_page():
    text = rb.all_docs_text()
    for path in rb.doc_files():
        assert path.read_text() in text, path


_CODE = re.compile(r"^( *)```.*?^\1```[ \t]*$", re.M | re.S)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6} +(.+?) *#* *$", re.M)


def _prose(text: str) -> str:
    """``text`` with its fenced blocks blanked (line numbers kept)."""
    return _CODE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def _anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens,
    repeats numbered."""
    seen: dict[str, int] = {}
    out = set()
    for heading in _HEADING.findall(_prose(text)):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_anchor_rule_matches_github():
    text = "# Quick start on an Atlas 800 / Ascend 950\n## Emulation kernels\n## `a_b` (c)\n## x\n## x\n"
    assert _anchors(text) == {"quick-start-on-an-atlas-800--ascend-950", "emulation-kernels",
                              "a_b-c", "x", "x-1"}
    assert _anchors("```bash\n# runs on CPU\n```\n") == set()


def test_every_relative_link_resolves():
    bad = []
    for path in rb.doc_files() + [REPO / "CHANGELOG.md"]:
        text = path.read_text()
        for m in _LINK.finditer(_prose(text)):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            where = f"{rb.relative(path)} line {text.count(chr(10), 0, m.start()) + 1}"
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path.resolve()
            if not dest.is_relative_to(REPO) or not dest.exists():
                bad.append(f"{where}: {target} (no such file in the repository)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest.read_text()):
                bad.append(f"{where}: {target} (no such heading)")
    assert not bad, "\n".join(bad)


# Files outside the repository (the workspace's notes) must not be cited: the docs/ pages
# carry what the code needs. (Spelt in pieces so that a grep for such citations does not
# find this line.)
_NOTES = "shared" + "/"
_OUTSIDE = re.compile(rf"{_NOTES}npu-ops\.md|{_NOTES}prior-art\.md|\.\./{_NOTES}")


def test_nothing_cites_files_outside_the_repository():
    files = rb.doc_files() + [REPO / "CHANGELOG.md"]
    files += sorted((REPO / "vllm_ascend_ext").rglob("*.py"))
    files += [p for p in sorted((REPO / "csrc").rglob("*")) if p.suffix in (".cpp", ".h")]
    hits = [f"{rb.relative(p)} line {i}: {line.strip()}" for p in files
            for i, line in enumerate(p.read_text().splitlines(), 1) if _OUTSIDE.search(line)]
    assert not hits, "\n".join(hits)


_P = "(APIServer pid=7) "
_RACE = "".join(_P + "ERROR 12-01 14:24:43 [async_llm.py:906] " + ln + "\n" for ln in (
    "AsyncLLM output_handler failed.", "Traceback (most recent call last):",
    '  File "vllm/v1/engine/async_llm.py", line 849, in output_handler',
    "    outputs = await engine_core.get_output_async()",
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack "
    "trace (above) for the root cause."))
_STOPPED = _P + "INFO 12-01 14:24:43 [core_client.py:777] [shutdown] MPClient: complete\n"
_AFTER = _P + "INFO 12-01 14:24:43 [launcher.py:279] [shutdown] API server: engine client stopped\n"


def test_only_vllms_shutdown_race_is_taken_out_of_a_server_log():
    clean = "start\n" + _STOPPED + _AFTER
    assert rb.without_vllm_shutdown_race("start\n" + _STOPPED + _RACE + _AFTER) == clean
    # Negative controls: before the engine stopped, another error, another traceback.
    early = "start\n" + _RACE + _STOPPED + _AFTER
    assert rb.without_vllm_shutdown_race(early) == early
    other = "start\n" + _STOPPED + _RACE.replace("EngineDeadError:", "RuntimeError:") + _AFTER
    assert rb.without_vllm_shutdown_race(other) == other
    extra = "Traceback (most recent call last):\nValueError: x\n"
    kept = rb.without_vllm_shutdown_race(extra + _STOPPED + _RACE + _AFTER)
    assert kept == extra + _STOPPED + _AFTER and "Traceback" in kept
