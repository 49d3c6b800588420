"""What a plugin worker does so that stopping a server is orderly.

Ctrl-C in a terminal sends SIGINT to the whole foreground process group: the API
server, the engine core and every worker process at once (``systemctl stop`` does the
same with SIGTERM). vLLM's worker process exits on either signal straight away, so the
step in flight dies under the engine core, which reports a fatal error, and the API
server answers the requests it was draining with 500s. The engine core already owns an
orderly stop: on its signal it drains (``--shutdown-timeout``), then closes each
worker's death pipe, on which the worker leaves its busy loop and shuts down; a worker
that does not exit in time gets SIGTERM, then SIGKILL. So a worker in its own process
(the ``mp`` executor) leaves both signals to its engine core.

At shutdown the worker logs the plugin's end-of-run summaries, each exactly once,
instead of relying on garbage collection (a multiprocessing child never runs
``atexit``).
"""

from __future__ import annotations

import signal


def leave_stop_signals_to_engine(parallel_config) -> bool:
    """In a worker process of the ``mp`` executor, ignore SIGINT/SIGTERM; True if it did.

    Never in the process that owns the engine (``uni`` executor): there the user's
    Ctrl-C must keep working.
    """
    if getattr(parallel_config, "distributed_executor_backend", None) != "mp":
        return False
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return True


def log_final_summaries(model_runner) -> int:
    """Ask every metadata builder of the runner that has one to log its final summary."""
    logged = 0
    for groups in getattr(model_runner, "attn_groups", None) or ():
        for group in groups:
            for builder in group.metadata_builders:
                log_final = getattr(builder, "log_final_summary", None)
                if log_final is not None:
                    log_final()
                    logged += 1
    return logged
