"""The plugin's user-facing error: bad configuration, bad environment variables.

Deliberately *not* a ``ValueError`` or ``AssertionError``: vLLM builds its config inside
pydantic dataclasses, and pydantic wraps those two (raised in ``__post_init__``, where
the platform's ``check_and_update_config`` runs) into a long ``ValidationError`` whose
last line is the only useful one. Any other exception passes through whole, so the
message a user reads first is the plugin's. The CLI prints it without a traceback and
exits with :data:`EXIT_CODE`.
"""

from __future__ import annotations

EXIT_CODE = 2  # as argparse uses for usage errors


class AscendExtError(Exception):
    """A configuration or environment error detected by the plugin.

    The message names the key or variable, the value and what is allowed.
    """
