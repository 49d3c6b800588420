"""One served model at a time: start ``python -m vllm_ascend_ext serve``, query it over
HTTP (completions with logprobs, chat for GSM8K), run ``bench serve`` against it, stop it
in order (SIGTERM to the plugin's supervisor, which drains and exits 0)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import redirect_stdout
from pathlib import Path

from tests.e2e.conftest import stock_env
from tests.e2e.nightly.models import ServedModel

START_TIMEOUT = float(os.environ.get("NIGHTLY_START_TIMEOUT", "1800"))
# Fixed prompts of the equality gate: different lengths, so prefill chunks of one run
# beside decodes of another.
PROMPTS = (
    "the quick brown fox jumps over the lazy dog " * 12,
    "one two three four five six seven eight nine ten",
    "Paris is the capital of France and Berlin is the capital of " * 6,
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerError(RuntimeError):
    pass


class Server:
    """``with Server(model, setting, log) as srv:`` -- ready when entered."""

    def __init__(self, model: ServedModel, setting: str, log: Path, *, stock: bool = False,
                 emulate: bool = True):
        self.model, self.setting, self.log, self.stock = model, setting, log, stock
        self.port = free_port()
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith("ASCEND_EXT_") and k != "VLLM_PLUGINS"}
        self.env.update(PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        if emulate:  # CPU: vLLM 0.32 cannot load its AOT compile cache there
            self.env.setdefault("VLLM_USE_AOT_COMPILE", "0")
            self.env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        if stock:  # plugin off: vLLM's own CPU platform (no plugin at all on an Ascend host)
            self.env.update(stock_env())
        else:
            self.env.update(model.env)
            if emulate:
                self.env["ASCEND_EXT_EMULATE"] = "1"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "vllm_ascend_ext", "serve", self.model.path,
               "--served-model-name", self.model.name, "--port", str(self.port), "--seed", "0",
               *self.model.serve_args]
        config = {} if self.stock else self.model.additional_config(self.setting)
        if config:
            cmd += ["--additional-config", json.dumps(config)]
        return cmd

    def __enter__(self) -> Server:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        out = open(self.log, "w")
        out.write(" ".join(self.command()) + "\n")
        out.flush()
        self.proc = subprocess.Popen(self.command(), env=self.env, stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"server exited with {self.proc.returncode} while starting "
                                  f"(log: {self.log}):\n{tail(self.log)}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1)
        self.__exit__(None, None, None)
        raise ServerError(f"server not ready after {START_TIMEOUT:.0f} s (log: {self.log})")

    def __exit__(self, *exc) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)  # the supervisor drains and stops the server
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    # -- queries ---------------------------------------------------------------------
    def _post(self, path: str, body: dict, timeout: float = 600) -> dict:
        req = urllib.request.Request(self.url + path, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())

    def greedy(self, prompts=PROMPTS, max_tokens: int = 16) -> list[dict]:
        """Greedy completions, concurrently (one batch of mixed lengths): token ids and
        the logprob of each sampled token."""
        def one(prompt: str) -> dict:
            r = self._post("/v1/completions", {
                "model": self.model.name, "prompt": prompt, "max_tokens": max_tokens,
                "temperature": 0.0, "logprobs": 1, "ignore_eos": True,
                "return_tokens_as_token_ids": True})
            lp = r["choices"][0]["logprobs"]
            return {"token_ids": [int(t.split(":", 1)[1]) for t in lp["tokens"]],
                    "logprobs": lp["token_logprobs"], "text": r["choices"][0]["text"]}

        with ThreadPoolExecutor(len(prompts)) as pool:
            return list(pool.map(one, prompts))

    def chat_answers(self, questions: list[str], max_tokens: int = 1024) -> list[str]:
        """GSM8K: one chat turn per question, greedy, 16 in flight."""
        def one(q: str) -> str:
            r = self._post("/v1/chat/completions", {
                "model": self.model.name, "temperature": 0.0, "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": q + "\nSolve it step by step and "
                              "end with: The answer is <number>."}],
                "chat_template_kwargs": {"enable_thinking": False}})
            return r["choices"][0]["message"]["content"] or ""

        with ThreadPoolExecutor(16) as pool:
            return list(pool.map(one, questions))

    def bench(self, out_dir: Path, name: str, *, input_len: int, output_len: int,
              num_prompts: int, concurrency: int) -> dict:
        """vLLM's ``bench serve`` client (random dataset, fixed seed), run in this process
        (its arguments are the CLI's; one import of vLLM serves every repetition): its
        result, also saved as ``<name>.json`` beside its printout ``<name>.log``."""
        from vllm.benchmarks.serve import add_cli_args, main
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        parser = FlexibleArgumentParser()
        add_cli_args(parser)
        args = parser.parse_args([
            "--model", self.model.path, "--served-model-name", self.model.name,
            "--port", str(self.port), "--dataset-name", "random",
            "--random-input-len", str(input_len), "--random-output-len", str(output_len),
            "--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency),
            "--seed", "0", "--ignore-eos", "--save-result", "--result-dir", str(out_dir),
            "--result-filename", f"{name}.json"])
        with open(out_dir / f"{name}.log", "w") as log, redirect_stdout(log):
            result = main(args)
        if result.get("completed") != num_prompts:
            raise ServerError(f"bench serve completed {result.get('completed')} of "
                              f"{num_prompts} requests ({out_dir / f'{name}.log'})")
        return result


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
