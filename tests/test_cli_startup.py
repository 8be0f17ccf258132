"""What `flask --app app …` imports before it runs a command: support types these commands, and
each one paid for every module of the service (the web's, the worker's HTTP client, Alembic),
about 1.2 s here and 3 s on a newcomer's laptop. `--help` and `brands list` now import only
what they use.

The time itself is not asserted (a shared machine's timings make a flaky test): it is measured
on a quiet machine and recorded in docs/benchmarks.md, "Command-line start-up". What a test can
hold is its cause, the modules a command imports, read from real `flask` processes with
`python -X importtime`.
"""

from __future__ import annotations

import re

import pytest

from tests.command_line import run_flask

IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \| +(\S+)$", re.M)
# Modules a command that needs neither the web nor the worker nor migrations must not import,
# each with what it is for. The first four are third-party packages of 50-100 ms each.
NOT_FOR_EVERY_COMMAND = {
    "aiohttp": "the delivery worker's HTTP client",
    "rq": "the worker's job queue",
    "redis": "Redis: rate limits, jobs, wake-ups",
    "alembic": "migrations: `db` only",
    "marshmallow": "the API's request and response schemas",
    "limits": "the API's rate limits",
    "blueprints.dashboard.session": "dashboard sign-in",
    "blueprints.errors": "the API's error answers",
    "blueprints.api.webhooks": "the API's routes",
    "blueprints.dashboard.endpoints": "the dashboard's pages",
    "workers.delivery_loop": "the delivery worker",
    "fixtures.demo": "the demo brand's story",
    "services.events": "publishing events",
}


def imported_by(environ: dict[str, str], *args: str) -> set[str]:
    """Every module `flask --app app ARGS` imported, as a real process does it."""
    result = run_flask(environ, *args, python_options=("-X", "importtime"))
    assert result.returncode == 0, result.stderr[-2000:]
    return set(IMPORTED.findall(result.stderr))


@pytest.mark.parametrize("args", [("--help",), ("brands", "list"), ("demo", "brand", "--help")])
def test_a_command_imports_only_what_it_uses(app, app_environ, args):
    imported = imported_by(app_environ, *args)
    assert "app" in imported and "sqlalchemy" in imported  # the check reads the imports
    needless = {name: why for name, why in NOT_FOR_EVERY_COMMAND.items() if name in imported}
    assert needless == {}, f"`flask --app app {' '.join(args)}` imports {needless}"


def test_the_commands_that_need_them_still_import_them(app, app_environ):
    """The same check sees what a command does import: `db` loads Flask-Migrate and Alembic
    when it runs, `routes` (Flask's own) gets the whole app, web and all."""
    assert "alembic" in imported_by(app_environ, "db", "current")
    routes = imported_by(app_environ, "routes")
    assert {"blueprints.dashboard.session", "blueprints.api.webhooks", "marshmallow"} <= routes
