"""`flask --app app secrets reencrypt`: the middle step of rotating `ENCRYPTION_KEY`
(docs/operations.md). stdout: how many endpoints' secrets were re-encrypted."""

from __future__ import annotations

import sys

import click
from flask.cli import AppGroup

secrets = AppGroup("secrets", help="Signing secrets at rest.")


@secrets.command("reencrypt")
def reencrypt() -> None:
    """Re-encrypt the signing secrets at rest.

    Every webhook signing secret, under the first key of ENCRYPTION_KEY."""
    from services.secret_rotation import reencrypt_signing_secrets  # see commands/__init__.py

    result = reencrypt_signing_secrets()
    click.echo(result.endpoints)
    if result.unreadable:
        click.echo(
            f"{len(result.unreadable)} endpoint(s) have a signing secret no key in "
            f"ENCRYPTION_KEY opens; rotate their secrets: {' '.join(result.unreadable)}",
            err=True,
        )
        sys.exit(1)
