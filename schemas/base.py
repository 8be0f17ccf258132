"""The base schema and field types every resource schema uses."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import ClassVar, cast

from marshmallow import Schema, ValidationError, fields, validate, validates_schema

from models.columns import id_pattern
from models.money import CURRENCIES

# Unicode's whole "Cc" category: C0, DEL and C1 (U+0080-U+009F, which include NEL), refused
# anywhere in a label or a description.
CONTROL_CHARACTERS = r"\x00-\x1f\x7f-\x9f"
# What `str.strip()` takes off that is not a control character (tests hold the list to Python's).
SPACES = r"\x20\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_ANY_CONTROL_CHARACTER = re.compile(f"[{CONTROL_CHARACTERS}]")
# What text can spell but PostgreSQL cannot store: NUL, and a UTF-16 surrogate without its pair
# ("\ud800"), which is no character at all.
NUL = "\x00"
_UNSTORABLE_CHARACTER = re.compile("[\x00\ud800-\udfff]")


def unstorable_text(value: str) -> str | None:
    """Why PostgreSQL cannot store `value` as text, or None when it can."""
    if not _UNSTORABLE_CHARACTER.search(value):
        return None
    if NUL in value:
        return "Must not contain NUL characters (\\u0000)."
    return "Must not contain a lone UTF-16 surrogate (\\ud800-\\udfff without its pair)."


def trimmed_text_pattern(max_length: int, *, may_be_blank: bool) -> str:
    """The `pattern` of exactly the strings a `Label` (or, blank allowed, an `OptionalText`) of
    `max_length` takes: no control character anywhere, and 1 to `max_length` characters once
    the surrounding spaces are trimmed. A `maxLength` would count the spaces too."""
    edge = f"[^{SPACES}{CONTROL_CHARACTERS}]"
    inside = f"[^{CONTROL_CHARACTERS}]"
    text = edge if max_length == 1 else f"{edge}(?:{inside}{{0,{max_length - 2}}}{edge})?"
    if may_be_blank:
        text = f"(?:{text})?"
    return f"^[{SPACES}]*{text}[{SPACES}]*$"


def camelcase(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


class ApiSchema(Schema):
    """Python attributes in snake_case, JSON keys in camelCase; unknown keys are an error.

    `min_fields`: how many of its fields a request must give at least (a PATCH that changes
    nothing is a mistake); the document states it as `minProperties`."""

    min_fields: ClassVar[int] = 0

    def on_bind_field(self, field_name: str, field_obj: fields.Field) -> None:
        field_obj.data_key = camelcase(field_obj.data_key or field_name)

    @validates_schema(pass_original=True)
    def _holds_only_storable_text(self, _data, original, **_) -> None:
        """A value PostgreSQL cannot store is refused here, naming its parameter, whichever face
        loads it: the API's query and headers, the dashboard's filters and forms (flat strings,
        or lists of them). A JSON body's nested values are refused as it is parsed
        (`blueprints.api.operations`), with the same messages."""
        if not isinstance(original, dict):
            return
        problems = {}
        for key, value in original.items():
            for item in value if isinstance(value, list) else [value]:
                problem = unstorable_text(item) if isinstance(item, str) else None
                if problem:
                    problems[key] = [problem]
                    break
        if problems:
            raise ValidationError(problems)

    @validates_schema(pass_original=True)
    def _gives_enough_fields(self, _data, original, **_) -> None:
        if self.min_fields and isinstance(original, dict) and len(original) < self.min_fields:
            # on_bind_field gave every field its data_key.
            names = ", ".join(cast(str, field.data_key) for field in self.load_fields.values())
            raise ValidationError(f"Give at least {self.min_fields} of {names}.")


def iso_timestamp(value: datetime) -> str:
    """ISO 8601 in UTC with a `Z` and milliseconds (CONTRACT section 3)."""
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Timestamp(fields.DateTime):
    """A timestamp field written by `iso_timestamp`."""

    def _serialize(self, value: datetime | None, attr, obj, **kwargs):
        return None if value is None else iso_timestamp(value)


class ResourceId(fields.String):
    """An id filter: an id of the named kind (`cmp_…`), or a 400 that says so, so that a deal id
    passed as `campaignId` is an error instead of a silently empty list. The form checked is
    the one the document states as its `pattern` (`models.columns.id_pattern`)."""

    def __init__(self, prefix: str, kind: str, **options) -> None:
        self.prefix = f"{prefix}_"
        self.kind = kind
        self.regex = re.compile(id_pattern(prefix))
        metadata = {
            "description": f"A {kind} id (`{self.prefix}…`).",
            "pattern": f"^{self.regex.pattern}$",
        } | options.pop("metadata", {})
        super().__init__(metadata=metadata, **options)

    def _deserialize(self, value, attr, data, **kwargs) -> str:
        text = super()._deserialize(value, attr, data, **kwargs)
        if not self.regex.fullmatch(text):
            raise ValidationError(f"Not a {self.kind} id (they start with {self.prefix}).")
        return text


class Label(fields.String):
    """A human label: control characters refused, surrounding spaces trimmed, then 1 to
    `max_length` characters. The document states the rule as the field's `pattern`."""

    def __init__(self, *, max_length: int, metadata: dict | None = None, **options) -> None:
        self.max_length = max_length
        metadata = dict(metadata or {})
        rule = (
            f"1-{max_length} characters once surrounding spaces are trimmed; no control characters."
        )
        metadata["description"] = f"{metadata.get('description', '')} {rule}".strip()
        pattern = trimmed_text_pattern(max_length, may_be_blank=False)
        super().__init__(metadata={"pattern": pattern, **metadata}, **options)

    def _deserialize(self, value, attr, data, **kwargs) -> str:
        text = _trimmed(super()._deserialize(value, attr, data, **kwargs))
        if not 1 <= len(text) <= self.max_length:
            raise ValidationError(f"Length must be between 1 and {self.max_length}.")
        return text


class OptionalText(fields.String):
    """Free text that may be left out: control characters (line breaks included) refused,
    surrounding spaces trimmed, at most `max_length` characters, and empty, blank or `null`
    stored as no text at all. The document states the rule as the field's `pattern`."""

    def __init__(self, *, max_length: int, metadata: dict | None = None, **options) -> None:
        self.max_length = max_length
        pattern = trimmed_text_pattern(max_length, may_be_blank=True)
        super().__init__(
            allow_none=True, metadata={"pattern": pattern, **(metadata or {})}, **options
        )

    # None for blank text: a String that may load as None (marshmallow types String as str).
    def _deserialize(self, value, attr, data, **kwargs) -> str | None:  # type: ignore[override]
        text = _trimmed(super()._deserialize(value, attr, data, **kwargs))
        if len(text) > self.max_length:
            raise ValidationError(f"Longer than maximum length {self.max_length}.")
        return text or None


def _trimmed(text: str) -> str:
    # Checked before trimming: a trailing line break is a control character, not a space.
    if _ANY_CONTROL_CHARACTER.search(text):
        raise ValidationError("Must not contain control characters (line breaks included).")
    return text.strip()


class JsonBoolean(fields.Boolean):
    """A JSON `true` or `false`, nothing else: `0`, `1` or `"yes"` in a body is a mistake to
    report, as the document's `boolean` says, not a value to guess at."""

    def _deserialize(self, value, attr, data, **kwargs) -> bool:
        if value is True or value is False:
            return value
        raise self.make_error("invalid", input=value)


class JsonInteger(fields.Integer):
    """A JSON integer, as the document's JSON Schema 2020-12 counts one: `1250`, or `1250.0`
    (the same number, no fraction). `12.5`, `"1250"` or `true` are mistakes to report, not
    numbers to round or convert."""

    def _deserialize(self, value, attr, data, **kwargs) -> int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.make_error("invalid", input=value)
        return super()._deserialize(value, attr, data, **kwargs)


class QueryBoolean(fields.Boolean):
    """A query parameter that is exactly `true` or `false` (how the document's `boolean` is
    written in a URL); `1`, `yes` or `True` are refused rather than guessed at."""

    truthy = {"true"}
    falsy = {"false"}


def money(description: str, **options) -> fields.Integer:
    """An amount in minor units (kobo, cents) of the record's `currency` (CONTRACT 3)."""
    return fields.Integer(metadata={"description": f"{description} In minor units."}, **options)


def currency_field() -> fields.String:
    return fields.String(
        validate=validate.OneOf(CURRENCIES),
        metadata={"description": "ISO 4217 code of every amount in this record.", "example": "NGN"},
    )
