"""What a plugin worker does so that stopping an engine is orderly.

Ctrl-C in a terminal sends SIGINT to the whole foreground process group: the process
that owns the engine, the engine core and every worker process at once. vLLM's worker
process exits on SIGINT straight away, so the step in flight dies under the engine core,
which then reports a fatal error. The engine core already owns an orderly stop: on its
signal it drains (``--shutdown-timeout``), then closes each worker's death pipe, on which
the worker leaves its busy loop and shuts down; a worker that does not exit in time gets
SIGTERM, then SIGKILL. So a worker in its own process (the ``mp`` executor) leaves SIGINT
to its engine core, with a Python-level handler that does nothing (unlike ``SIG_IGN``,
not inherited by programs it executes). SIGTERM keeps vLLM's meaning: the engine's
escalation, or a service manager stopping everything (for systemd, ``KillMode=mixed``
signals only the main process and lets it stop the rest in order).

At shutdown the worker logs the plugin's end-of-run summaries, each exactly once, before
the engine reports the worker gone, instead of leaving them to garbage collection or
interpreter exit (never reached by a killed process).
"""

from __future__ import annotations

import signal


def _left_to_the_engine(signum, frame) -> None:
    """SIGINT in a worker: the engine core stops this worker (see module docstring)."""


def leave_ctrl_c_to_engine(parallel_config) -> bool:
    """In a worker process of the ``mp`` executor, leave SIGINT to the engine; True if so.

    Never in the process that owns the engine (``uni`` executor): there the user's
    Ctrl-C must keep working.
    """
    if getattr(parallel_config, "distributed_executor_backend", None) != "mp":
        return False
    signal.signal(signal.SIGINT, _left_to_the_engine)
    return True


def log_final_summaries(model_runner) -> int:
    """Ask every metadata builder of the runner that has one to log its final summary,
    then the NPU contract's (contract mode) and speculative decoding's acceptance (with
    speculation); returns how many were logged."""
    from vllm_ascend_ext.contract import mode

    logged = 0
    if mode.enabled():
        mode.log_summary()
        logged += 1
    for groups in getattr(model_runner, "attn_groups", None) or ():
        for group in groups:
            for builder in group.metadata_builders:
                log_final = getattr(builder, "log_final_summary", None)
                if log_final is not None:
                    log_final()
                    logged += 1
    acceptance = getattr(model_runner, "spec_acceptance", None)
    counter = acceptance() if callable(acceptance) else None
    if counter is not None:
        counter.log_final()
        logged += 1
    return logged
