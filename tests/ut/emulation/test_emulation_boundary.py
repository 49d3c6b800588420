"""Emulation's own room: the emulation-only code (the emulated platform, the CPU stand-in
of the device runtime and its graph recorder, the emulated workers, the KV budget) lives
in ``vllm_ascend_ext.emulation``, and the production path imports nothing from it. The
only production mention is the platform entry point's qualnames (strings), which vLLM
resolves when emulation is asked for."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "vllm_ascend_ext"
EMULATION = "vllm_ascend_ext.emulation"
# Module files that may *name* the emulation package (as strings, never imports).
QUALNAME_HOLDERS = {"__init__.py"}
# What an Atlas process imports: platform, worker and runner, attention, MoE, operators.
PRODUCTION_ENTRY = [
    "vllm_ascend_ext.platform.npu", "vllm_ascend_ext.worker.npu_worker",
    "vllm_ascend_ext.worker.npu_model_runner", "vllm_ascend_ext.worker.npu_graph",
    "vllm_ascend_ext.attention.fia.backend", "vllm_ascend_ext.attention.sfa.backend",
    "vllm_ascend_ext.moe.method", "vllm_ascend_ext.distributed.communicator",
    "vllm_ascend_ext.models", "vllm_ascend_ext.quantization.config",
]


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, module: str | None = None) -> set[str]:
    """Every module ``path`` (the module named ``module``, by default its name in the
    package) imports, at the top or inside a function (relative imports resolved)."""
    tree = ast.parse(path.read_text(), str(path))
    module = module or _module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def production_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py")
                  if "emulation" not in p.relative_to(PACKAGE).parts[:1]
                  and "__pycache__" not in p.parts)


def test_no_production_module_imports_the_emulation_package():
    offenders = {str(p.relative_to(PACKAGE)): sorted(m for m in imported_modules(p)
                                                     if m.startswith(EMULATION))
                 for p in production_files()}
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, f"production code imports emulation-only code: {offenders}"


def test_only_the_entry_point_names_the_emulation_package():
    naming = sorted(str(p.relative_to(PACKAGE)) for p in production_files()
                    if EMULATION in p.read_text())
    assert set(naming) <= QUALNAME_HOLDERS, naming


def test_the_import_scan_sees_imports_inside_functions(tmp_path):
    """The scan's own control: a function-local and a relative import are found."""
    target = tmp_path / "probe.py"
    target.write_text("def f():\n    from vllm_ascend_ext.emulation import cpu_npu\n"
                      "    from ..emulation.platform import EmulatedAscendPlatform\n")
    found = imported_modules(target, "vllm_ascend_ext.attention.probe")
    assert {"vllm_ascend_ext.emulation.cpu_npu",
            "vllm_ascend_ext.emulation.platform"} <= found


def test_importing_the_production_path_loads_no_emulation_module():
    code = ("import importlib, json, sys\n"
            f"for name in {PRODUCTION_ENTRY!r}:\n    importlib.import_module(name)\n"
            "print(json.dumps(sorted(m for m in sys.modules "
            f"if m.startswith({EMULATION!r}))))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, cwd=str(PACKAGE.parent), check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
