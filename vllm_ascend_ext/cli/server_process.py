"""The server process the ``serve`` supervisor starts: vLLM's ``serve`` as the plugin's CLI
runs it (see :mod:`vllm_ascend_ext.cli.supervise`). Not meant to be started by hand."""

from vllm_ascend_ext.cli.entry import console_main

if __name__ == "__main__":
    console_main(supervised=False)
