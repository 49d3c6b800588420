"""Helpers for e2e tests: each engine runs in its own process (vLLM picks its platform
once per process), forked from a zygote that has imported vLLM already (``zygote.py``),
and reports one ``RESULT {json}`` line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e import engine_cache

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def child_env(emulate: bool, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_EXT_")}
    env.pop("VLLM_PLUGINS", None)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_ENABLE_V1_MULTIPROCESSING="0", PYTHONUNBUFFERED="1")
    # Stock runs too: vLLM 0.32 cannot load its AOT compile cache on the CPU and would
    # recompile at every start (platform/config_hooks.py: compile_cache_that_loads).
    env.setdefault("VLLM_USE_AOT_COMPILE", "0")
    if emulate:
        env["ASCEND_EXT_EMULATE"] = "1"
    env.update(extra)
    return env


_ZYGOTES: dict = {}     # platform environment -> zygote.Zygote


def _run(script: str, args: tuple, env: dict[str, str], timeout: int) -> tuple[int, str, str]:
    """(rc, stdout, stderr) of one run of ``script``: forked from a zygote that has
    imported vLLM already (``zygote.py``), or in a fresh interpreter with E2E_ZYGOTE=0."""
    cwd = str(REPO / "tests")
    if os.environ.get("E2E_ZYGOTE", "1") == "0":
        return _fresh(script, args, env, cwd, timeout)
    import tempfile

    from tests.e2e import zygote

    k = zygote.key(env)
    if k not in _ZYGOTES:
        _ZYGOTES[k] = zygote.Zygote({**env, "PYTHONPATH": _pythonpath()}, cwd)
    with tempfile.TemporaryDirectory() as tmp:
        out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        try:
            rc, timed_out = _ZYGOTES[k].run(str(HERE / script), list(args), env, cwd, out,
                                            err, timeout)
        except zygote.ZygoteRefused:
            return _fresh(script, args, env, cwd, timeout)
        with open(out) as f_out, open(err) as f_err:
            stdout, stderr = f_out.read(), f_err.read()
    if timed_out:
        raise subprocess.TimeoutExpired([script, *args], timeout, stdout, stderr)
    return rc, stdout, stderr


def _fresh(script: str, args: tuple, env: dict[str, str], cwd: str,
           timeout: int) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, str(HERE / script), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def _pythonpath() -> str:
    """The zygote imports ``tests.e2e.zygote``'s siblings by path; keep the caller's path."""
    return os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)


@pytest.fixture(scope="session", autouse=True)
def _close_zygotes():
    yield
    for z in _ZYGOTES.values():
        z.close()
    _ZYGOTES.clear()


def run_script(script: str, *args: str, emulate: bool, timeout: int = 600,
               fresh: bool = False, **env) -> dict:
    """The ``RESULT`` of ``script`` run with ``args`` and ``env``: computed once per test
    run for each distinct (script, arguments, environment) and read by every test that
    asks for it, on either worker (``engine_cache.py``); ``fresh`` runs it again
    whatever ran before (a determinism check, the zygote's own tests)."""
    full_env = child_env(emulate, **env)
    result = engine_cache.CACHE.get_or_compute(
        engine_cache.key(script, args, full_env), fresh,
        lambda: _result(script, args, full_env, timeout))
    if emulate:
        assert_npu_engine_path(result, env)
    return json.loads(json.dumps(result))   # each caller its own copy


def _result(script: str, args: tuple, full_env: dict[str, str], timeout: int) -> dict:
    rc, stdout, stderr = _run(script, args, full_env, timeout)
    engine_cache.CACHE.count_starts(script, stdout + stderr)
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise AssertionError(
        f"{script} {' '.join(args)} produced no RESULT (rc={rc}):\n"
        f"{stdout[-3000:]}\n{stderr[-6000:]}"
    )


# What every emulated engine runs unless a test asks for vLLM's CPU worker
# (ASCEND_EXT_EMULATED_WORKER=cpu): the plugin's NPU worker and runner on the stand-in.
NPU_ENGINE_PATH = {"worker": "EmulatedNPUWorker", "runner": "EmulatedNPUModelRunner",
                   "runtime": "cpu-npu-stand-in"}


def max_logprob_gap(a: dict, b: dict) -> float:
    """The largest difference between two runs' logprobs of the tokens they generated."""
    return max(abs(x - y) for la, lb in zip(a["logprobs"], b["logprobs"]) for x, y in zip(la, lb))


def greedy_departures(ref: dict, got: dict, bound: float) -> list[str]:
    """Where ``got``'s greedy continuations depart from ``ref``'s beyond rounding noise
    (empty: none), in the spirit of vLLM's ``check_logprobs_close``. Up to a prompt's first
    differing token the chosen tokens' logprobs agree within ``bound``; at that token the
    two runs face a near tie: each run's token is among the other's top logprobs, within
    ``2 * bound`` of the token that run chose (each logprob may move by ``bound``), or the
    reference holds an exact tie between the two (its own pick was arbitrary). The prompt's comparison ends
    there (the continuations condition on different tokens). ``ref``/``got``: run_dp.py
    results (``tokens``, ``logprobs``, ``top``)."""
    out = []
    for i, (ref_tokens, got_tokens) in enumerate(zip(ref["tokens"], got["tokens"], strict=True)):
        for j, (a, b) in enumerate(zip(ref_tokens, got_tokens)):
            la, lb = ref["logprobs"][i][j], got["logprobs"][i][j]
            if a == b:
                if abs(la - lb) > bound:
                    out.append(f"prompt {i} token {j}: logprobs {la:.4f} vs {lb:.4f}")
                continue
            theirs, ours = ref["top"][i][j], got["top"][i][j]
            if theirs.get(str(b)) == la and str(a) in ours:
                break   # an exact tie in the reference: its own choice was arbitrary
            if (str(a) not in ours or str(b) not in theirs or theirs[str(b)] < la - 2 * bound
                    or ours[str(a)] < lb - 2 * bound):
                out.append(f"prompt {i} token {j}: {a} vs {b}, not a near tie "
                           f"(ref top {theirs}, got top {ours})")
            break
    return out


def assert_npu_engine_path(result: dict, env: dict) -> None:
    """Asserted, not assumed: an emulated run reports the NPU engine path it ran."""
    if "engine" not in result and "platform" in result and "tokens" not in result:
        return   # a configuration check that starts no engine (check_config_errors.py)
    engine = result.get("engine")
    assert engine is not None, "the script's RESULT does not say which engine path ran"
    if env.get("ASCEND_EXT_EMULATED_WORKER", "npu") == "npu":
        ran = {k: engine.get(k) for k in NPU_ENGINE_PATH}
        assert ran == NPU_ENGINE_PATH, f"emulated run did not take the NPU engine path: {engine}"


def stock_env() -> dict[str, str]:
    """Environment of a stock vLLM run (vLLM's CPU platform) on any host. On an Ascend
    host the installed plugin is active without emulation (it selects the NPU
    platform), so there vLLM is told to load no plugin at all."""
    from vllm_ascend_ext.platform.probe import npu_present

    return {"VLLM_PLUGINS": "no-plugin"} if npu_present() else {}


def oracle_runs(script: str, base: tuple, plain: dict, folder, rate: str = "0.6"):
    """Cached speculative runs of ``script`` with ``base`` arguments and the draft oracle
    fed by ``plain`` (a plain run's result, written to ``folder``): ``get(k, *extra,
    **env)`` runs MTP with k drafts once per distinct arguments."""
    path = folder / "plain.json"
    path.write_text(json.dumps(plain))
    cache: dict = {}

    def get(k: int, *extra: str, **env: str) -> dict:
        key = (k, extra, tuple(sorted(env.items())))
        if key not in cache:
            cache[key] = run_script(script, *base, "--mtp", str(k), "--oracle", str(path),
                                    rate, *extra, emulate=True, timeout=900, **env)
        return cache[key]
    get.plain_file = str(path)
    return get


@pytest.fixture(scope="session")
def runs():
    """``run_llm.py`` runs, stock vLLM's with ``stock_env()``; shared like every
    ``run_script`` run."""
    def get(*args: str, emulate: bool, **env: str) -> dict:
        if not emulate:
            env = {**stock_env(), **env}
        return run_script("run_llm.py", *args, emulate=emulate, **env)

    return get


# Markers, in one place: every e2e test is ``e2e``; servers (the ``serve`` group and the
# documentation's server blocks) and the nightly dry run are marked too, so that
# ``-m "not server and not nightly"`` runs the engine tests alone.
# The suite runs on two pytest-xdist workers (pyproject: ``-n 2 --dist loadgroup``). A
# group runs whole on one worker, in order: a file, or files that share engine runs (the
# session's ``runs`` cache) or a port (README's servers listen on 8000). Groups start
# longest first; the unit tests, one unit each, fill the gaps.
GROUPS = {
    "test_nightly_dry_run.py": "nightly",
    "test_readme_commands.py": "doc-commands",
    "test_engine_path.py": "run_llm", "test_emulated_engine.py": "run_llm",
    "test_mixed_split.py": "run_llm", "test_moe_engine.py": "run_llm",
    "test_contract_engine.py": "run_llm",
    "test_serve_dead_engine.py": "serve", "test_serve_startup_stop.py": "serve",
}
ORDER = ("nightly", "doc-commands", "run_llm", "test_sfa_engine", "test_hybrid_accuracy",
         "test_gdn_engine", "serve")


def group_of(item) -> str:
    return GROUPS.get(item.path.name, item.path.stem)


def pytest_collection_modifyitems(config, items):
    here = str(HERE)
    rank = {}
    for item in items:
        if not str(item.path).startswith(here):
            continue
        item.add_marker(pytest.mark.e2e)
        group = group_of(item)
        item.add_marker(pytest.mark.xdist_group(group))
        rank[item.nodeid] = ORDER.index(group) if group in ORDER else len(ORDER)
        if group == "serve" or "-server-" in item.name:
            item.add_marker(pytest.mark.server)
        if group == "nightly":
            item.add_marker(pytest.mark.nightly)
            item.add_marker(pytest.mark.slow)
    # e2e groups first, longest first (a stable sort keeps each group's own order)
    items.sort(key=lambda it: rank.get(it.nodeid, len(ORDER) + 1))
