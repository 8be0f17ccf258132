"""Failpoints: named places in a request where the test suite can make a real server process
die or hang, to prove what a crash at exactly that moment leaves behind.

Only an app built with APP_ENV=test reads them, from `FAILPOINTS`: comma-separated
`name=action`, where action is `exit` (the process ends at once, as if killed, without
rolling anything back itself), `sleep:SECONDS` (it hangs, holding what it holds) or `raise`
(an unexpected exception, handled like any other). Anywhere else `failpoint()` costs one
dictionary lookup.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from flask import current_app

ACTIONS = ("exit", "sleep", "raise")


class FailpointError(RuntimeError):
    """Raised by a failpoint set to `raise`."""


def parse_failpoints(raw: str) -> Mapping[str, str]:
    """`name=action,...` checked; a ValueError names what is wrong."""
    points = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        name, _, action = item.partition("=")
        kind, _, argument = action.partition(":")
        if not name or kind not in ACTIONS or (kind == "sleep") != bool(argument):
            raise ValueError(f"FAILPOINTS entry {item!r} is not name=exit|raise|sleep:SECONDS")
        if kind == "sleep":
            float(argument)
        points[name.strip()] = action
    return points


def failpoint(name: str) -> None:
    action = current_app.extensions["settings"].failpoints.get(name)
    if action is None:
        return
    if action == "exit":
        os._exit(70)
    if action == "raise":
        raise FailpointError(f"failpoint {name}")
    time.sleep(float(action.partition(":")[2]))
