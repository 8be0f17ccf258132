"""The base schema and field types every resource schema uses."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from marshmallow import Schema, ValidationError, fields, validate

from models.columns import ID_LENGTH
from models.money import CURRENCIES

_CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")
# Unicode's whole "Cc" category: C0, DEL and C1 (U+0080-U+009F, which include NEL).
_ANY_CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def camelcase(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


class ApiSchema(Schema):
    """Python attributes in snake_case, JSON keys in camelCase; unknown keys are an error."""

    def on_bind_field(self, field_name: str, field_obj: fields.Field) -> None:
        field_obj.data_key = camelcase(field_obj.data_key or field_name)


def iso_timestamp(value: datetime) -> str:
    """ISO 8601 in UTC with a `Z` and milliseconds (CONTRACT section 3)."""
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Timestamp(fields.DateTime):
    """A timestamp field written by `iso_timestamp`."""

    def _serialize(self, value: datetime | None, attr, obj, **kwargs):
        return None if value is None else iso_timestamp(value)


class ResourceId(fields.String):
    """An id filter: an id of the named kind (`cmp_…`), or a 400 that says so, so that a deal id
    passed as `campaignId` is an error instead of a silently empty list."""

    def __init__(self, prefix: str, kind: str, **options) -> None:
        self.prefix = f"{prefix}_"
        self.kind = kind
        metadata = {"description": f"A {kind} id (`{self.prefix}…`)."} | options.pop("metadata", {})
        super().__init__(metadata=metadata, **options)

    def _deserialize(self, value, attr, data, **kwargs) -> str:
        text = super()._deserialize(value, attr, data, **kwargs)
        if not text.startswith(self.prefix) or len(text) > ID_LENGTH:
            raise ValidationError(f"Not a {self.kind} id (they start with {self.prefix}).")
        return text


class Label(fields.String):
    """A human label: surrounding whitespace trimmed, control characters refused."""

    def _deserialize(self, value, attr, data, **kwargs) -> str:
        text = super()._deserialize(value, attr, data, **kwargs).strip()
        if _CONTROL_CHARACTERS.search(text):
            raise ValidationError("Must not contain control characters.")
        return text


class OptionalText(fields.String):
    """Free text that may be left out: surrounding whitespace trimmed, control characters (line
    breaks included) refused, and empty (or `null`) stored as no text at all."""

    def __init__(self, *, max_length: int, metadata: dict | None = None, **options) -> None:
        self.max_length = max_length
        metadata = {"maxLength": max_length, **(metadata or {})}
        super().__init__(allow_none=True, metadata=metadata, **options)

    def _deserialize(self, value, attr, data, **kwargs) -> str | None:
        text = super()._deserialize(value, attr, data, **kwargs).strip()
        if _ANY_CONTROL_CHARACTER.search(text):
            raise ValidationError("Must not contain control characters (line breaks included).")
        if len(text) > self.max_length:
            raise ValidationError(f"Longer than maximum length {self.max_length}.")
        return text or None


def money(description: str, **options) -> fields.Integer:
    """An amount in minor units (kobo, cents) of the record's `currency` (CONTRACT 3)."""
    return fields.Integer(metadata={"description": f"{description} In minor units."}, **options)


def currency_field() -> fields.String:
    return fields.String(
        validate=validate.OneOf(CURRENCIES),
        metadata={"description": "ISO 4217 code of every amount in this record.", "example": "NGN"},
    )
