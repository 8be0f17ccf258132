"""Failpoints: named places in a request where the test suite can make a real server process
die or hang, to prove what a crash at exactly that moment leaves behind.

Only an app built with APP_ENV=test reads them, from `FAILPOINTS` (parsed by `config.py`):
comma-separated `name=action`, where action is `exit` (the process ends at once, as if killed,
without rolling anything back itself), `sleep:SECONDS` (it hangs, holding what it holds, each
time it passes there), `sleep-once:SECONDS` (the first time only: a process stalled once) or
`raise` (an unexpected exception, handled like any other). Anywhere else `failpoint()` costs one
dictionary lookup.
"""

from __future__ import annotations

import os
import time

from flask import current_app


class FailpointError(RuntimeError):
    """Raised by a failpoint set to `raise`."""


def failpoint(name: str) -> None:
    action = current_app.extensions["settings"].failpoints.get(name)
    if action is None:
        return
    if action == "exit":
        os._exit(70)
    if action == "raise":
        raise FailpointError(f"failpoint {name}")
    if action.startswith("sleep-once"):
        if name in _slept:
            return
        _slept.add(name)
    time.sleep(float(action.partition(":")[2]))


_slept: set[str] = set()  # the sleep-once failpoints this process has passed
