"""Column types and id generation shared by every model."""

from __future__ import annotations

import secrets
import threading
import time
from datetime import UTC, datetime

from sqlalchemy import DateTime, String
from sqlalchemy.types import TypeDecorator

_CROCKFORD32 = "0123456789abcdefghjkmnpqrstvwxyz"
ID_LENGTH = 40
ID_CHARACTERS = "[0-9a-z]"
_id_lock = threading.Lock()
_last_value = 0


def new_id(prefix: str, at: datetime | None = None) -> str:
    """An opaque id with a type prefix (CONTRACT section 3), e.g. `key_01jd3...`.

    48 bits of milliseconds then 80 random bits, in Crockford base32 (26 characters): ids sort
    by creation time, which keeps B-tree inserts local and makes id a usable tie-breaker. Within
    one millisecond a process counts up from its last id instead of drawing again, so the ids
    one process makes sort in the order it made them (an event's deliveries, a demo step's
    events). `at` stamps a record whose creation time is not now (the demo's month of
    history), so that its id still sorts with its `created_at`.
    """
    global _last_value
    if at is not None:
        value = (int(at.timestamp() * 1000) << 80) | secrets.randbits(80)
    else:
        with _id_lock:
            value = (int(time.time() * 1000) << 80) | secrets.randbits(80)
            if value >> 80 <= _last_value >> 80:
                value = _last_value + 1
            _last_value = value
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD32[value & 31])
        value >>= 5
    return f"{prefix}_{''.join(reversed(chars))}"


def id_time(value: str) -> datetime | None:
    """When `new_id` made the id (its first 48 bits, milliseconds), or None for a string that is
    not one of its ids. For an id whose record may be gone: was it made long ago?"""
    _, _, encoded = value.rpartition("_")
    if len(encoded) != 26 or encoded[0] not in "01234567":  # 130 bits hold 128 when it starts so
        return None
    number = 0
    for char in encoded:
        digit = _CROCKFORD32.find(char)
        if digit < 0:
            return None
        number = number * 32 + digit
    try:
        return datetime.fromtimestamp((number >> 80) / 1000, UTC)
    except (OverflowError, OSError, ValueError):
        return None


def id_pattern(prefix: str) -> str:
    """The regular expression (unanchored) of an id of one type: its prefix, `_`, then what
    `new_id` writes, within the column's length. The router matches path ids with it, the
    id filters validate with it and the OpenAPI document states it as their `pattern`."""
    return f"{prefix}_{ID_CHARACTERS}{{1,{ID_LENGTH - len(prefix) - 1}}}"


def id_column_type() -> String:
    return String(ID_LENGTH)


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator):
    """Aware UTC datetimes in and out of a `timestamptz`, whatever the session's TimeZone.

    A naive datetime on the way in is a programming error, not something to guess about.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given where an aware UTC datetime is required")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        return None if value is None else value.astimezone(UTC)
