"""`flask --app app ...` commands for support and operators (CONTRACT section 2).

stdout carries only the value a script wants to capture; notes and errors go to stderr, and an
error exits non-zero with one line.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import click
from flask import Flask

from extensions import db
from services.errors import DomainError, ValidationFailed


def register_commands(app: Flask) -> None:
    from commands.brands import brands
    from commands.demo import demo
    from commands.endpoints import endpoints
    from commands.events import events
    from commands.secrets import secrets
    from workers.cli import worker_command

    app.cli.add_command(brands)
    app.cli.add_command(demo)
    app.cli.add_command(endpoints)
    app.cli.add_command(events)
    app.cli.add_command(secrets)
    app.cli.add_command(worker_command)


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
