"""Minting, recognising and hashing the service's secrets (API keys, bootstrap tokens and webhook
signing secrets).

An API key or bootstrap token is `prefix + 32 random base62 characters + 6-character checksum`.
The checksum (CRC32 of the rest) lets a typo or a truncated paste be refused without a database
lookup, and lets secret scanners recognise a real key. Only a SHA-256 hash is stored: with ~190
bits of entropy a slow password hash adds nothing but latency to every request.

A webhook signing secret is `whsec_` + standard base64 (padded) of 32 random bytes, the format of
Standard Webhooks, whose libraries decode it to the HMAC key (CONTRACT 12.1). Those issued before
were minted like API keys (`whsec_` + 38 base62 characters) and keep signing with the whole string
as the key until rotated: `standard_signing_key` tells the two apart.
"""

from __future__ import annotations

import base64
import binascii
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
SIGNING_KEY_BYTES = 32
# Padded base64 of 32 bytes: 43 characters and one "=". An older signing secret has 38 base62
# characters after `whsec_`, so length and alphabet tell the two formats apart.
_BASE64_KEY_LENGTH = 44


def generate_secret(prefix: str) -> str:
    body = "".join(secrets.choice(_BASE62) for _ in range(_BODY_LENGTH))
    return prefix + body + _checksum(prefix + body)


def generate_signing_secret() -> str:
    """A new webhook signing secret: `whsec_` + base64 of 32 random bytes (CONTRACT 12.1)."""
    key = secrets.token_bytes(SIGNING_KEY_BYTES)
    return SIGNING_SECRET_PREFIX + base64.b64encode(key).decode()


def standard_signing_key(secret: str) -> bytes:
    """The HMAC key of `webhook-signature` for `secret`: the 32 bytes a `whsec_` + base64 secret
    encodes, as every Standard Webhooks library decodes it; for any other secret (one issued
    before, base62 with a checksum), the whole string as UTF-8 bytes, as it always signed."""
    return _base64_signing_key(secret) or secret.encode()


def is_base64_signing_secret(secret: str) -> bool:
    """True for a signing secret of the current format, False for one issued before."""
    return _base64_signing_key(secret) is not None


def _base64_signing_key(secret: str) -> bytes | None:
    if not secret.startswith(SIGNING_SECRET_PREFIX):
        return None
    encoded = secret[len(SIGNING_SECRET_PREFIX) :]
    if len(encoded) != _BASE64_KEY_LENGTH:
        return None
    try:
        key = base64.b64decode(encoded, validate=True)
    except binascii.Error:
        return None
    # Canonical only: the one encoding of 32 bytes that generate_signing_secret makes.
    if len(key) != SIGNING_KEY_BYTES or base64.b64encode(key).decode() != encoded:
        return None
    return key


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
