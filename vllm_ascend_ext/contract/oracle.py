"""The operator contract's source files, from the pinned torch-npu wheel (never this repo).

torch-npu 2.13.0 (the torch_npu line that matches vLLM 0.32's torch 2.13) ships, beside
its compiled kernels, plain files that describe every operator: the registration
schemas (``csrc/aten/npu_native_functions_by_codegen.yaml``), the official Meta kernels
(``op_plugin/meta/_meta_registrations.py``), the ATB ops' Python definitions
(``op_plugin/atb/_atb_ops.py``) and every operator's documentation
(``_op_plugin_docs.py``). Those files are the same in every platform's wheel; the
manylinux x86-64 CPython 3.11 one is pinned by name and SHA-256.

Where they come from, first match wins:
1. an installed torch_npu (an NPU host): its package directory, read as files (never
   imported here: importing needs CANN);
2. ``ASCEND_EXT_ORACLE_WHEEL``: a path to the pinned wheel;
3. the cache, ``$XDG_CACHE_HOME/vllm_ascend_ext`` (``~/.cache/vllm_ascend_ext``); on first
   use the wheel is fetched there with ``pip download --no-deps`` and its hash checked.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from vllm_ascend_ext import envs
from vllm_ascend_ext.errors import AscendExtError

VERSION = "2.13.0"
WHEEL = f"torch_npu-{VERSION}-cp311-cp311-manylinux_2_28_x86_64.whl"
WHEEL_SHA256 = "0deb809cf447d3fce636ccfdc9c9f874950f1fe76f18f4aaab31e2d345f7dac0"
WHEEL_ENV = envs.ORACLE_WHEEL

SCHEMAS = "torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml"
METAS = "torch_npu/op_plugin/meta/_meta_registrations.py"
DOCS = "torch_npu/_op_plugin_docs.py"
ATB_OPS = "torch_npu/op_plugin/atb/_atb_ops.py"
ERROR_CODES = "torch_npu/utils/_error_code.py"
FILES = (SCHEMAS, METAS, DOCS, ATB_OPS, ERROR_CODES)


class OracleUnavailable(AscendExtError):
    """The pinned torch-npu files could not be found or fetched."""


@dataclass(frozen=True)
class OracleFiles:
    source: str                  # where the files were read from
    texts: dict[str, str]        # FILES -> text

    def __getitem__(self, name: str) -> str:
        return self.texts[name]


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "vllm_ascend_ext"


def _installed_package_dir() -> Path | None:
    spec = importlib.util.find_spec("torch_npu")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_wheel(dest: Path) -> Path:
    """Download the pinned wheel into ``dest`` (pip, no dependencies, no install)."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.11", "--implementation", "cp",
           "--platform", "manylinux_2_28_x86_64", "-d", str(dest), f"torch-npu=={VERSION}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    path = dest / WHEEL
    if proc.returncode != 0 or not path.exists():
        raise OracleUnavailable(
            f"could not fetch {WHEEL} (the NPU contract's oracle) with `{' '.join(cmd)}`: "
            f"{(proc.stderr or proc.stdout).strip().splitlines()[-1:]}; put the wheel's path "
            f"in {WHEEL_ENV} to use a local copy")
    return path


def _wheel_path() -> Path:
    given = os.environ.get(WHEEL_ENV)
    path = Path(given) if given else cache_dir() / WHEEL
    if not path.exists():
        if given:
            raise OracleUnavailable(f"{WHEEL_ENV}={given!r}: no such file")
        path = fetch_wheel(path.parent)
    if _sha256(path) != WHEEL_SHA256:
        raise OracleUnavailable(
            f"{path} is not the pinned {WHEEL} (SHA-256 {WHEEL_SHA256}); delete it to refetch")
    return path


@functools.cache
def load() -> OracleFiles:
    """The oracle's files (cached for the process)."""
    installed = _installed_package_dir()
    if installed is not None and (installed.parent / METAS).exists():
        root = installed.parent
        return OracleFiles(f"installed torch_npu at {installed}",
                           {name: (root / name).read_text(encoding="utf-8") for name in FILES})
    path = _wheel_path()
    with zipfile.ZipFile(path) as wheel:
        texts = {name: wheel.read(name).decode("utf-8") for name in FILES}
    return OracleFiles(f"{path.name} (sha256 {WHEEL_SHA256[:12]}...)", texts)


def read_members(names) -> dict[str, bytes]:
    """Files of the pinned torch_npu (paths inside the wheel), from the same place
    ``load`` reads: an installed torch_npu's files, else the pinned wheel (opened once)."""
    installed = _installed_package_dir()
    if installed is not None and (installed.parent / METAS).exists():
        return {name: (installed.parent / name).read_bytes() for name in names}
    with zipfile.ZipFile(_wheel_path()) as wheel:
        return {name: wheel.read(name) for name in names}


def read_member(name: str) -> bytes:
    return read_members([name])[name]


def python_members() -> list[str]:
    """Paths of the pinned torch_npu's Python files."""
    installed = _installed_package_dir()
    if installed is not None and (installed.parent / METAS).exists():
        return sorted(str(p.relative_to(installed.parent)) for p in installed.rglob("*.py"))
    with zipfile.ZipFile(_wheel_path()) as wheel:
        return sorted(n for n in wheel.namelist() if n.endswith(".py"))
