"""Each operation's curl command, as the document's `x-codeSamples`: the deployment's URL, the
operation's credential and required headers, and a JSON body of the body schema's examples, so a
reader pastes it and it works. Ids and secrets are shell variables named as in the README's
walkthrough (`$BRAND`, `$KEY`, `$ENDPOINT`); /docs fills in the brand's id when it knows it.
"""

from __future__ import annotations

import json
from typing import Any

# Stands for the absolute API base in the built document; `with_server` puts the address the
# document was fetched from in its place.
SERVER = "{server}"
CREDENTIAL_VARIABLES = {"ApiKey": "KEY", "BootstrapToken": "TOKEN"}
_SCHEMAS = "#/components/schemas/"


def path_variable(parameter: str) -> str:
    """The shell variable of a path parameter: `endpointId` -> `ENDPOINT`; `keyId` -> `KEY_ID`,
    since `KEY` is the API key."""
    variable = parameter.removesuffix("Id").upper()
    return f"{variable}_ID" if variable in CREDENTIAL_VARIABLES.values() else variable


def add_code_samples(document: dict[str, Any]) -> None:
    """`x-codeSamples` (a curl command) on every operation of `document`."""
    schemes = document["components"]["securitySchemes"]
    schemas = document["components"]["schemas"]
    for path, item in document["paths"].items():
        for method, operation in item.items():
            source = _curl(method, path, operation, schemes, schemas)
            operation["x-codeSamples"] = [{"lang": "Shell", "label": "curl", "source": source}]


def with_server(paths: dict[str, Any], server: str) -> dict[str, Any]:
    """`paths` with the code samples' base URL set to `server` (the built paths are shared
    between requests, so the changed operations are copies)."""
    return {
        path: {
            method: operation
            | {
                "x-codeSamples": [
                    sample | {"source": sample["source"].replace(SERVER, server)}
                    for sample in operation["x-codeSamples"]
                ]
            }
            for method, operation in item.items()
        }
        for path, item in paths.items()
    }


def _curl(
    method: str,
    path: str,
    operation: dict[str, Any],
    schemes: dict[str, Any],
    schemas: dict[str, Any],
) -> str:
    url = SERVER + path
    for parameter in operation.get("parameters", []):
        if parameter["in"] == "path":
            url = url.replace("{" + parameter["name"] + "}", "$" + path_variable(parameter["name"]))
    lines = [f'curl -X {method.upper()} "{url}"' if method != "get" else f'curl "{url}"']
    security = operation.get("security") or []
    if security:
        scheme = next(iter(security[0]))
        lines.append(f'-H "{schemes[scheme]["name"]}: ${CREDENTIAL_VARIABLES[scheme]}"')
    for parameter in operation.get("parameters", []):
        if parameter["in"] == "header" and parameter.get("required"):
            value = parameter["schema"].get("example", parameter.get("example", "…"))
            lines.append(f'-H "{parameter["name"]}: {value}"')
    body = operation.get("requestBody", {}).get("content", {}).get("application/json")
    if body is not None:
        example = _body_example(body["schema"], schemas)
        lines.append('-H "Content-Type: application/json"')
        text = json.dumps(example, indent=2, ensure_ascii=False).replace("\n", "\n  ")
        lines.append("-d '" + text.replace("'", "'\\''") + "'")
    return " \\\n  ".join(lines)


def _body_example(schema: dict[str, Any], schemas: dict[str, Any]) -> dict[str, Any]:
    """The body's required fields and those with an example or a default, at their example
    (else default) value."""
    body = schemas[schema["$ref"].removeprefix(_SCHEMAS)]
    required = set(body.get("required", []))
    example: dict[str, Any] = {}
    for name, field in body["properties"].items():
        if "example" in field:
            example[name] = field["example"]
        elif field.get("default") is not None or name in required:
            example[name] = field.get("default")
    return example
