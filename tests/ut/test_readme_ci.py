"""README.md's structure: tagged command blocks, the set-up that .ci/run runs, tables that
mirror the code. Executing the CPU blocks: tests/e2e/test_readme_commands.py."""

from __future__ import annotations

from pathlib import Path

from tests import readme_blocks as rb
from vllm_ascend_ext.config import schema_rows
from vllm_ascend_ext.platform import soc

REPO = Path(__file__).resolve().parents[2]


def test_every_command_block_carries_a_tag():
    blocks = rb.parse()
    assert not [b.where() for b in rb.untagged(blocks)]
    kinds = [b.kind for b in blocks if b.kind]
    assert kinds.count(rb.SETUP) == 1 and rb.SERVER in kinds and rb.SKIP in kinds
    # A client block needs a server block before it, with no other kind in between.
    current = None
    for b in blocks:
        if b.kind == rb.SERVER:
            current = b
        elif b.kind == rb.CLIENT:
            assert current is not None, f"{b.where()}: client block without a server above"
        elif b.kind is not None:
            current = None


def test_ci_runs_exactly_readme_install_and_test_commands():
    def commands(kind):
        blocks = [b for b in rb.parse() if b.kind == kind]
        assert len(blocks) == 1, kind
        return [ln for ln in blocks[0].text.splitlines() if ln.strip() and not ln.startswith("#")]

    # two steps: the install, then the tests
    (install,), (test,) = commands(rb.SETUP), commands(rb.TESTS)
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.startswith(("#", "set ", "cd "))]
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


def test_readme_config_table_matches_the_schema():
    text = (REPO / "README.md").read_text()
    for key, allowed, meaning in schema_rows():
        assert f"| `{key}` | {allowed.replace('|', chr(92) + '|')} | {meaning} |" in text, key


def test_readme_soc_table_is_every_soc_the_code_knows():
    text = (REPO / "README.md").read_text()
    for chip in soc.known():
        served = "yes" if chip.family in soc.SUPPORTED_FAMILIES else "no: refused at startup"
        assert f"| `{chip.name}` | {chip.family} | {chip.version} | {served} |" in text, chip
    for alias, name in soc.aliases().items():
        assert f"`{alias}`" in text and soc.from_name(alias).name == name


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
