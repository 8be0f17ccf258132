"""The base schema and field types every resource schema uses."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from marshmallow import Schema, ValidationError, fields

_CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")


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


class Label(fields.String):
    """A human label: surrounding whitespace trimmed, control characters refused."""

    def _deserialize(self, value, attr, data, **kwargs) -> str:
        text = super()._deserialize(value, attr, data, **kwargs).strip()
        if _CONTROL_CHARACTERS.search(text):
            raise ValidationError("Must not contain control characters.")
        return text
