"""Minting, recognising and hashing the service's secrets (API keys, bootstrap tokens and webhook
signing secrets).

A secret is `prefix + 32 random base62 characters + 6-character checksum`. The checksum (CRC32 of
the rest) lets a typo or a truncated paste be refused without a database lookup, and lets secret
scanners recognise a real key. Only a SHA-256 hash is stored: with ~190 bits of entropy a slow
password hash adds nothing but latency to every request.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import string
import zlib

API_KEY_PREFIX = "svc_live_"
BOOTSTRAP_TOKEN_PREFIX = "bst_"  # noqa: S105 - a prefix, not a token
# Signing secrets are encrypted at rest, not hashed: the worker needs them to sign.
SIGNING_SECRET_PREFIX = "whsec_"  # noqa: S105 - a prefix, not a secret
KEY_PREFIX_LENGTH = 12
CREDENTIAL_PREFIXES = (API_KEY_PREFIX, BOOTSTRAP_TOKEN_PREFIX, SIGNING_SECRET_PREFIX)
# Distinctive enough to refuse wherever they appear in a text ("Bearer svc_live_…",
# "secret=whsec_…"); `bst_` is not: it occurs inside ordinary words ("subst_", "abst_").
_CREDENTIAL_MARKERS = (API_KEY_PREFIX, SIGNING_SECRET_PREFIX)

_BASE62 = string.digits + string.ascii_letters
_BODY_LENGTH = 32
_CHECKSUM_LENGTH = 6


def generate_secret(prefix: str) -> str:
    body = "".join(secrets.choice(_BASE62) for _ in range(_BODY_LENGTH))
    return prefix + body + _checksum(prefix + body)


def is_well_formed(secret: str, prefix: str) -> bool:
    """True when `secret` has the shape and a valid checksum of a secret minted with `prefix`."""
    if not secret.startswith(prefix):
        return False
    rest = secret[len(prefix) :]
    if len(rest) != _BODY_LENGTH + _CHECKSUM_LENGTH or any(c not in _BASE62 for c in rest):
        return False
    body, checksum = rest[:_BODY_LENGTH], rest[_BODY_LENGTH:]
    return hmac.compare_digest(checksum, _checksum(prefix + body))


def looks_like_credential(text: str) -> str | None:
    """The prefix of this service's credential that `text` appears to carry, or None.

    Callers say which kind was found, never the text: it may be a live secret.
    """
    stripped = text.strip()
    for prefix in CREDENTIAL_PREFIXES:
        if stripped.startswith(prefix):
            return prefix
    for marker in _CREDENTIAL_MARKERS:
        if marker in text:
            return marker
    return None


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def hash_matches(stored_hash: str, secret: str) -> bool:
    """Constant-time comparison of a stored hash with the hash of a presented secret."""
    return hmac.compare_digest(stored_hash, hash_secret(secret))


def key_prefix(secret: str) -> str:
    return secret[:KEY_PREFIX_LENGTH]


def _checksum(text: str) -> str:
    value = zlib.crc32(text.encode())
    chars = []
    for _ in range(_CHECKSUM_LENGTH):
        value, digit = divmod(value, 62)
        chars.append(_BASE62[digit])
    return "".join(reversed(chars))
