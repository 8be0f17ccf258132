"""Moving every signing secret at rest to the first key of `ENCRYPTION_KEY`: the middle step of
rotating that key (docs/operations.md). Batches of rows, each locked only for its own short
transaction, so deliveries and rotate-secret go on meanwhile."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import select

from extensions import db
from models import WebhookEndpoint
from services.secret_box import InvalidToken, secret_box

BATCH_SIZE = 200


@dataclass
class Reencrypted:
    endpoints: int = 0
    # Endpoints with a ciphertext no configured key opens: left as they are. Until their secret
    # is rotated (rotate-secret) they cannot sign, and dropping a key changes nothing for them.
    unreadable: list[str] = field(default_factory=list)


def reencrypt_signing_secrets(*, batch_size: int = BATCH_SIZE) -> Reencrypted:
    """Re-encrypt the current and previous signing secret of every endpoint, deleted ones too
    (their rows keep a ciphertext), under the first key."""
    box = secret_box()
    result = Reencrypted()
    after = ""
    while True:
        batch = db.session.scalars(
            select(WebhookEndpoint)
            .where(WebhookEndpoint.id > after)
            .order_by(WebhookEndpoint.id)
            .limit(batch_size)
            # Not FOR UPDATE: publishers' KEY SHARE locks on these rows must not wait.
            .with_for_update(key_share=True)
        ).all()
        if not batch:
            return result
        for endpoint in batch:
            try:
                current = box.reencrypt(endpoint.secret_ciphertext)
                previous = (
                    box.reencrypt(endpoint.previous_secret_ciphertext)
                    if endpoint.previous_secret_ciphertext
                    else None
                )
            except InvalidToken:
                result.unreadable.append(endpoint.id)
                continue
            endpoint.secret_ciphertext = current
            endpoint.previous_secret_ciphertext = previous
            result.endpoints += 1
        db.session.commit()
        after = batch[-1].id
