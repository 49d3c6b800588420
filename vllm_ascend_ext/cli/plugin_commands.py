"""The plugin's own subcommands; none takes the name of a vLLM subcommand.

They have the interface of vLLM's ``CLISubcommand`` (``name``, ``cmd``, ``validate``,
``subparser_init``) without importing vLLM, so they answer in a fraction of a second:
``main`` runs them before it assembles vLLM's parsers.
"""

from __future__ import annotations

import argparse


class PluginCommand:
    name: str

    @staticmethod
    def cmd(args: argparse.Namespace) -> int:
        raise NotImplementedError

    def validate(self, args: argparse.Namespace) -> None:
        pass

    def subparser_init(self, subparsers):
        raise NotImplementedError


def _tiny_paths() -> dict:
    from vllm_ascend_ext.models import (
        tiny_dsa_path,
        tiny_dsa_w8a8_wide_path,
        tiny_mimo_path,
        tiny_model_path,
        tiny_qwen3_next_path,
        tiny_qwen_moe_path,
        tiny_qwen_moe_wide_path,
    )

    return {"qwen3": tiny_model_path, "qwen-moe": tiny_qwen_moe_path,
            "qwen-moe-wide": tiny_qwen_moe_wide_path,
            "qwen3-next": tiny_qwen3_next_path, "dsa": tiny_dsa_path,
            "dsa-w8a8": lambda: tiny_dsa_path(quantized=True),
            "dsa-w8a8-wide": tiny_dsa_w8a8_wide_path, "mimo": tiny_mimo_path}


class TinyModelPathCommand(PluginCommand):
    """``tiny-model-path [qwen3|qwen-moe|qwen-moe-wide|qwen3-next|dsa|dsa-w8a8|dsa-w8a8-wide|mimo]``: print an embedded tiny
    model's directory."""

    name = "tiny-model-path"

    @staticmethod
    def cmd(args: argparse.Namespace) -> int:
        print(_tiny_paths()[args.which]())
        return 0

    def subparser_init(self, subparsers):
        parser = subparsers.add_parser(
            self.name,
            help="Print the directory of an embedded tiny model (no download needed).",
            description="Print the directory of an embedded tiny model: the Qwen3-style one "
            "(qwen3, default), the Qwen MoE one (qwen-moe), the hybrid Qwen3-Next one "
            "(qwen3-next: Gated-DeltaNet and full-attention layers), the DeepSeek-V3.2-style "
            "one (dsa) or its ModelSlim W8A8 variant (dsa-w8a8; dsa-w8a8-wide at hidden size 1024, "
            "generated on first use), or the dense MiMo-style "
            "one with an MTP layer (mimo). Their weights are random at a realistic scale: "
            "the text they generate is gibberish by design.",
        )
        parser.add_argument("which", nargs="?", default="qwen3", choices=list(_tiny_paths()))
        return parser


class DoctorCommand(PluginCommand):
    """``doctor [--json] [--smoke]``: versions, SoC, devices, the compiled library, the NPU platform's
    facts and the contract oracle, read without starting the NPU runtime."""

    name = "doctor"

    @staticmethod
    def cmd(args: argparse.Namespace) -> int:
        from vllm_ascend_ext.cli.doctor import run

        return run(args)

    def subparser_init(self, subparsers):
        parser = subparsers.add_parser(
            self.name, help="Report what this machine gives the plugin (exit 1 if unhealthy).",
            description="Report torch / vLLM / torch_npu / CANN versions, the SoC (real or "
            "emulated), NPU devices, whether _C_ascend_ext is built and for which dispatch "
            "keys, the NPU platform's worker, attention and graph facts, and whether the NPU "
            "contract's oracle is at hand. Exit 0 when the plugin can serve here.")
        parser.add_argument("--json", action="store_true", help="print JSON")
        parser.add_argument("--smoke", action="store_true",
                            help="on an NPU host, also run one case per operator the plugin "
                            "calls against its reference (starts the NPU runtime here)")
        return parser


def plugin_commands() -> list[PluginCommand]:
    return [TinyModelPathCommand(), DoctorCommand()]
