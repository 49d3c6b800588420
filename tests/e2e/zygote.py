"""Engine runs without paying the import each time: a zygote process imports torch, vLLM
and the plugin once, then forks one child per run.

About 8 of the ~20 seconds an e2e engine run takes on the 2-core machine is ``from vllm
import LLM``; the suite starts dozens of engines. A zygote is keyed by the environment
read during that import (``PLATFORM_ENV``: the variables that decide vLLM's platform,
vLLM's logging set-up, Hugging Face's offline switches, the module path); everything
else a run sets (``ASCEND_EXT_SOC``, contract mode, vLLM's run-time variables; the
emulated worker choice picks the platform, so it keys the zygote) is read at run time and is set, whole, in the child before its script runs
as ``__main__``. Nothing passes from one run to the next: each
child starts from the zygote's import-only state (the zygote itself never builds an
engine), and a crash, a timeout or a signal ends only that child. Output goes to files the
caller reads, as from a subprocess; the child runs the interpreter's exit handlers
(``atexit``, ``weakref.finalize``: shutdown log lines) before it exits. The zygote refuses
to fork once a thread other than its main one exists (a forked child would inherit a
lock held by it): the run then falls back to a fresh interpreter.

``E2E_ZYGOTE=0`` runs every script in a fresh interpreter instead (``conftest.run_script``).

Protocol (stdin/stdout of the zygote, one JSON object per line): request ``{"id",
"script", "args", "env", "cwd", "out", "err", "timeout"}``, answer ``{"id", "rc",
"timed_out"}`` on a line starting with ``ZYGOTE``; the zygote's own messages go to a log
file whose tail a failure reports.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

PLATFORM_ENV = ("ASCEND_EXT_EMULATE", "ASCEND_EXT_EMULATED_WORKER", "VLLM_PLUGINS", "VLLM_CONFIGURE_LOGGING",
                "VLLM_LOGGING_LEVEL", "VLLM_LOGGING_CONFIG_PATH", "VLLM_LOGGING_PREFIX",
                "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "PYTHONPATH")
TAG = "ZYGOTE "


def key(env: dict[str, str]) -> tuple:
    return tuple((name, env.get(name)) for name in PLATFORM_ENV)


class ZygoteRefused(RuntimeError):
    """The zygote cannot fork safely (it has threads): run the script in a fresh process."""


class Zygote:
    """Client side: one zygote process for one platform environment."""

    def __init__(self, env: dict[str, str], cwd: str) -> None:
        import tempfile

        self.log = tempfile.NamedTemporaryFile(prefix="zygote-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [sys.executable, __file__], cwd=cwd, env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self.log, text=True, bufsize=1)
        self.next_id = 0

    def run(self, script: str, args: list[str], env: dict[str, str], cwd: str, out: str,
            err: str, timeout: int) -> tuple[int, bool]:
        self.next_id += 1
        request = dict(id=self.next_id, script=script, args=list(args), env=env, cwd=cwd,
                       out=out, err=err, timeout=timeout)
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith(TAG):
                answer = json.loads(line[len(TAG):])
                if answer["id"] != self.next_id:      # an earlier, abandoned run's answer
                    continue
                if "refused" in answer:
                    raise ZygoteRefused(answer["refused"])
                return answer["rc"], answer["timed_out"]
        with open(self.log.name, errors="replace") as f:
            tail = f.read()[-4000:]
        raise RuntimeError(f"the zygote for {script} exited (rc={self.proc.wait()}):\n{tail}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()
        os.unlink(self.log.name)


def _child(req: dict) -> None:
    """In the forked child: become the script's process and run it; never returns."""
    code = 1
    try:
        os.environ.clear()
        os.environ.update(req["env"])
        os.chdir(req["cwd"])
        for fd, path in ((1, req["out"]), (2, req["err"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        import runpy

        sys.path.insert(0, os.path.dirname(os.path.abspath(req["script"])))
        sys.argv = [req["script"], *req["args"]]
        try:
            runpy.run_path(req["script"], run_name="__main__")
            code = 0
        except SystemExit as e:
            if e.code is not None and not isinstance(e.code, int):
                print(e.code, file=sys.stderr)        # as the interpreter would
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        import atexit

        atexit._run_exitfuncs()                       # shutdown handlers, as at a real exit
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _wait(pid: int, timeout: float) -> tuple[int, bool]:
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status), False
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            return os.waitstatus_to_exitcode(status), True
        time.sleep(0.05)


def _freeze_imported_heap() -> None:
    """Move the imported modules' objects out of the collector's reach (``gc.freeze``, as
    for any pre-fork server): an engine start calls ``gc.collect`` a dozen times before
    vLLM freezes its own heap (model loading, memory profiling), and each full collection
    of the ~700k objects the imports leave costs 0.3-0.7 s on the 2-core machine. Frozen,
    the children's collections scan only what they create; nothing they create is kept."""
    import gc

    gc.collect()
    gc.freeze()


def serve() -> None:
    """Zygote side: import once, then fork a child per request line."""
    import importlib
    import threading

    import torch  # noqa: F401
    from vllm import LLM, SamplingParams  # noqa: F401

    import vllm_ascend_ext  # noqa: F401

    for later in ("vllm.v1.worker.gpu_worker", "vllm.v1.worker.gpu_model_runner"):
        importlib.import_module(later)   # what every engine imports after the LLM class
    _freeze_imported_heap()
    if os.environ.get("E2E_ZYGOTE_TEST_THREAD") == "1":   # tests: a zygote that has a thread
        threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
    channel = sys.stdout
    for line in sys.stdin:
        req = json.loads(line)
        if threading.active_count() != 1:      # forking would copy their locks, held
            refused = f"the zygote has threads {threading.enumerate()}"
            channel.write(TAG + json.dumps({"id": req["id"], "refused": refused}) + "\n")
            channel.flush()
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(req)
        rc, timed_out = _wait(pid, req["timeout"])
        answer = {"id": req["id"], "rc": rc, "timed_out": timed_out}
        channel.write(TAG + json.dumps(answer) + "\n")
        channel.flush()


if __name__ == "__main__":
    serve()
