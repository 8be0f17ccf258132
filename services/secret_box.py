"""Encryption at rest of webhook signing secrets (CONTRACT section 1, `ENCRYPTION_KEY`).

The worker needs the plain signing secret to sign each attempt, so it cannot be hashed like an
API key; it is encrypted with Fernet (AES-128-CBC + HMAC-SHA256, from `cryptography`) instead.
`ENCRYPTION_KEY` may hold several comma-separated Fernet keys: the first encrypts, all decrypt,
so an operator rotates the key by prepending a new one and re-encrypting at leisure.
"""

from __future__ import annotations

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from flask import current_app

from config import ConfigError


class SecretBox:
    def __init__(self, encryption_key: str) -> None:
        keys = [part.strip() for part in encryption_key.split(",") if part.strip()]
        try:
            self._fernet = MultiFernet([Fernet(key) for key in keys])
        except (ValueError, TypeError):
            # The message must not echo the key.
            raise ConfigError(
                "ENCRYPTION_KEY must be one or more comma-separated Fernet keys (32 url-safe "
                'base64 bytes each; generate one with `python -c "from cryptography.fernet '
                'import Fernet; print(Fernet.generate_key().decode())"`)'
            ) from None

    def encrypt(self, plaintext: str) -> str:
        return self._fernet.encrypt(plaintext.encode()).decode()

    def reencrypt(self, ciphertext: str) -> str:
        """The same plaintext under the first key. :raise InvalidToken: no configured key
        decrypts it."""
        return self._fernet.rotate(ciphertext.encode()).decode()

    def decrypt(self, ciphertext: str, *, ttl: int | None = None) -> str:
        """:raise InvalidToken: the ciphertext was made with a key no longer configured, or
        (with `ttl`) more than `ttl` seconds ago."""
        return self._fernet.decrypt(ciphertext.encode(), ttl=ttl).decode()


def secret_box() -> SecretBox:
    """The app's box, built once from its settings at app creation."""
    return current_app.extensions["secret_box"]


__all__ = ["InvalidToken", "SecretBox", "secret_box"]
