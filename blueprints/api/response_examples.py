"""A whole example of each JSON answer in the document: the envelope as the service writes it
(that answer's `status`, `statusCode`, `message` and `errorCode`, a request id) around an example
of its `data` built from the schemas' own examples. Without one, a renderer invents the envelope
(`"statusCode": 1`, `"message": "string"`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

REQUEST_ID_EXAMPLE = "req_0f561f9c45be8f55502128f4"
_SCHEMAS = "#/components/schemas/"
_MAX_DEPTH = 8
_FORMATS = {"date-time": "2026-11-20T08:15:00.000Z"}
# The `errors` of a VALIDATION_ERROR example.
_FIELD_ERRORS = {"name": ["Missing data for required field."]}


def add_response_examples(document: dict[str, Any], error_statuses: Mapping[str, int]) -> None:
    """An `example` on every JSON response of `document`, and on its shared error responses
    (`error_statuses`: each one's HTTP status by name)."""
    schemas = document["components"]["schemas"]
    for item in document["paths"].values():
        for operation in item.values():
            for status, response in operation["responses"].items():
                media = response.get("content", {}).get("application/json")
                if media is None:
                    continue
                if int(status) >= 400:  # an operation's own telling of a shared error
                    media["example"] = _failure(int(status), response)
                else:
                    media["example"] = _success(int(status), response, media["schema"], schemas)
    for name, response in document["components"]["responses"].items():
        media = response["content"]["application/json"]
        media["example"] = _failure(error_statuses[name], response)


def _failure(status: int, response: dict[str, Any]) -> dict[str, Any]:
    """From an error response's description, `ERROR_CODE: meaning; more`."""
    code, meaning = response["description"].split(": ", 1)
    return {
        "status": False,
        "statusCode": status,
        "message": meaning[:1].upper() + meaning[1:].split(";")[0].rstrip("."),
        "errorCode": code,
        "requestId": REQUEST_ID_EXAMPLE,
        **({"errors": _FIELD_ERRORS} if code == "VALIDATION_ERROR" else {}),
    }


def _success(
    status: int, response: dict[str, Any], schema: dict[str, Any], schemas: dict[str, Any]
) -> dict[str, Any]:
    envelope = _resolved(schema, schemas)["properties"]
    example = {
        "status": True,
        "statusCode": status,
        "message": response["description"],
        "data": example_of(envelope["data"], schemas),
        "requestId": REQUEST_ID_EXAMPLE,
    }
    if "meta" in envelope:
        example["meta"] = example_of(envelope["meta"], schemas)
    return example


def example_of(schema: dict[str, Any], schemas: dict[str, Any], depth: int = 0) -> Any:
    """A value of `schema`: its example, default or first allowed value, else one built from
    its properties or items; null for what may be null and says nothing more."""
    schema = _resolved(schema, schemas)
    types = schema.get("type")
    types = [types] if isinstance(types, str) else types or []
    if "example" in schema:
        return schema["example"]
    if "default" in schema:
        return schema["default"]
    if schema.get("enum"):
        return schema["enum"][0]
    if "null" in types or depth > _MAX_DEPTH:
        return None
    if "anyOf" in schema:
        first = next(option for option in schema["anyOf"] if option.get("type") != "null")
        return example_of(first, schemas, depth + 1)
    if "properties" in schema:
        return {
            name: example_of(field, schemas, depth + 1)
            for name, field in schema["properties"].items()
        }
    if "array" in types:
        return [example_of(schema.get("items", {}), schemas, depth + 1)]
    if "string" in types:
        return _FORMATS.get(schema.get("format", ""), "string")
    if "integer" in types or "number" in types:
        return schema.get("minimum", 0)
    if "boolean" in types:
        return True
    return {}


def _resolved(schema: dict[str, Any], schemas: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = schemas[schema["$ref"].removeprefix(_SCHEMAS)]
    return schema
