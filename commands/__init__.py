"""`flask --app app ...` commands for support and operators (CONTRACT section 2).

stdout carries only the value a script wants to capture; notes and errors go to stderr, and an
error exits non-zero with one line: a missing setting and an unreachable database included
(`--help` needs neither).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click
from flask import Flask, current_app
from flask.cli import FlaskGroup
from sqlalchemy.exc import OperationalError

from extensions import db
from services.errors import DomainError, ValidationFailed

Callback = Callable[..., Any]


def register_commands(app: Flask, migrations: str) -> None:
    """Our command groups, and the `db` group of Flask-Migrate: the one `init_migrations`
    added, or, where it was not called (`flask --app app …`), a stand-in that sets
    Flask-Migrate up (on `migrations`) when `db` runs. Every command says in one line that it
    cannot reach the database.

    Each command module imports at its top only what listing the commands needs (names, help,
    option defaults), and the services a command calls when it runs: `--help` and `brands list`
    start in a third of the time they took importing everything (docs/benchmarks.md,
    "Command-line start-up")."""
    from commands.brands import brands
    from commands.demo import demo
    from commands.endpoints import endpoints
    from commands.events import events
    from commands.secrets import secrets
    from commands.worker import worker_command

    app.cli.add_command(brands)
    app.cli.add_command(demo)
    app.cli.add_command(endpoints)
    app.cli.add_command(events)
    app.cli.add_command(secrets)
    app.cli.add_command(worker_command)
    if "migrate" not in app.extensions:
        app.cli.add_command(MigrationCommands(migrations))
    _wrap_every_callback(app, _explaining_connection_failures)


class MigrationCommands(click.Group):
    """`flask db …` until it runs: the name and help `flask --help` lists, standing in for
    Flask-Migrate's group, which imports Alembic. Asked to run (or to show its own help), it
    sets Flask-Migrate up on the app and hands over to that group, wrapped as our commands
    are."""

    def __init__(
        self, directory: str, wraps: tuple[Callable[[Callback], Callback], ...] = ()
    ) -> None:
        super().__init__("db", help="Perform database migrations.")
        self.directory = directory
        self.wraps = wraps

    def wrapped(self, wrap: Callable[[Callback], Callback]) -> MigrationCommands:
        return MigrationCommands(self.directory, (*self.wraps, wrap))

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        from extensions import init_migrations

        app = current_app._get_current_object()  # type: ignore[attr-defined]  # a LocalProxy
        if "migrate" not in app.extensions:
            init_migrations(app, self.directory)  # adds Flask-Migrate's group in our place
        group = app.cli.commands["db"]
        for wrap in self.wraps:
            group = _wrapped(group, wrap)
        return group.make_context(info_name, args, parent=parent, **extra)


def app_for_help_only(app: Flask, problem: str, migrations: str) -> Flask:
    """What `flask --app app` gets when the settings cannot be read (no DATABASE_URL and no
    `make run`): its commands, so that every `--help` works, each of which, when run, exits with
    `problem` in one line.

    `flask` loads the app to list or find the app's commands, before any `--help` is read; it
    loads it again only to run a command of its own (`routes`, `shell`): that one stops here.
    """
    if not loaded_for_its_commands():
        raise click.ClickException(problem)
    register_commands(app, migrations)

    def refuse(_callback: Callback) -> Callback:
        def refused(*_args: Any, **_kwargs: Any) -> None:
            raise click.ClickException(problem)

        return refused

    _wrap_every_callback(app, refuse)
    return app


def loaded_by_the_command_line() -> bool:
    """Whether `flask --app app ...` is loading the app (gunicorn and tests call it outside
    any click command)."""
    return click.get_current_context(silent=True) is not None


def loaded_for_its_commands() -> bool:
    """Whether `flask` is loading the app to find, list (`--help`) or run one of the app's own
    commands (ours, `db`): it does so from its top-level group, before any command runs. Such
    an app serves nothing, so it needs no route, page or request hook, whose imports are most
    of a command's start-up. Flask's own `run`, `routes` and `shell` load the app from within
    themselves, and get all of it; so do gunicorn and the tests, outside any command."""
    context = click.get_current_context(silent=True)
    return (
        context is not None and context.parent is None and isinstance(context.command, FlaskGroup)
    )


def _explaining_connection_failures(callback: Callback) -> Callback:
    @functools.wraps(callback)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return callback(*args, **kwargs)
        except OperationalError as error:
            if error.statement is not None:  # connected, then a statement failed: not ours
                raise
            # psycopg's first line names the host and port (or socket), never the password.
            reason = str(error.orig).splitlines()[0] if error.orig else type(error).__name__
            raise click.ClickException(
                f"cannot reach the database ({reason}): start `make run`, or check DATABASE_URL"
            ) from None

    return run


def _wrap_every_callback(app: Flask, wrap: Callable[[Callback], Callback]) -> None:
    """Each of the app's commands (the `db` group's too), replaced by a copy whose callbacks run
    through `wrap`: names, help, options and arguments stay as they were."""
    for name, command in list(app.cli.commands.items()):
        app.cli.commands[name] = _wrapped(command, wrap)


def _wrapped(command: click.Command, wrap: Callable[[Callback], Callback]) -> click.Command:
    if isinstance(command, MigrationCommands):
        return command.wrapped(wrap)
    clone = copy.copy(command)
    if isinstance(command, click.Group) and isinstance(clone, click.Group):
        clone.commands = {name: _wrapped(sub, wrap) for name, sub in command.commands.items()}
    elif command.callback is not None:
        clone.callback = wrap(command.callback)
    return clone


@contextmanager
def command_transaction() -> Iterator[None]:
    """Commit what the block did, or roll all of it back and exit with a one-line error."""
    try:
        yield
        db.session.commit()
    except DomainError as error:
        db.session.rollback()
        raise click.ClickException(_one_line(error)) from None
    except BaseException:
        db.session.rollback()
        raise


def _one_line(error: DomainError) -> str:
    if isinstance(error, ValidationFailed) and error.errors:
        details = "; ".join(f"{field}: {' '.join(msgs)}" for field, msgs in error.errors.items())
        return f"{error.message}: {details}"
    return error.message
