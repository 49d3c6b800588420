"""README's two set-up commands are what .ci/run runs; its config table is the schema's."""

from __future__ import annotations

from pathlib import Path

from vllm_ascend_ext.config import schema_rows

REPO = Path(__file__).resolve().parents[2]


def _readme_setup_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def test_ci_runs_exactly_readme_install_and_test_commands():
    install, test = _readme_setup_commands()
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.startswith(("#", "set ", "cd "))]
    assert ci == [install, test]
    assert "pytest" in test and "pip install" in install


def test_readme_config_table_matches_the_schema():
    text = (REPO / "README.md").read_text()
    for key, allowed, meaning in schema_rows():
        assert f"| `{key}` | {allowed.replace('|', chr(92) + '|')} | {meaning} |" in text, key
