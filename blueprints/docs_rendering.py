"""Turns the OpenAPI document into what templates/docs.html renders: operations grouped by tag,
`$ref`s resolved, schemas flattened into field rows, example bodies and curl commands built from
the schemas' examples and defaults. Works on any OpenAPI 3.0 document of the shape apispec writes;
it reads only the document, never the routes.

Registered on the `system` blueprint with `register_docs_helpers(system)`, which adds the template
global `api_reference(spec, base_url)` and the filters `doc_text` (block) and `doc_inline`."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any
from urllib.parse import quote

from flask import Blueprint, Flask
from markupsafe import Markup, escape

HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
# Operations of a tag are listed list, get, create, update, delete, then other actions (a POST
# that creates nothing: send a test, rotate a secret); the document's order within each.
_LIST, _GET, _CREATE, _UPDATE, _DELETE, _ACTION = range(6)
_MAX_DEPTH = 6

_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_BOLD = re.compile(r"\*\*(.+?)\*\*")
_LIST_ITEM = re.compile(r"^\s*[-*]\s+")
_NOTE = re.compile(r"^\*\*([^*\n]{1,40}?):?\*\*:?\s*(.*)$", re.DOTALL)
_CODED_DESCRIPTION = re.compile(r"^([A-Z][A-Z0-9_]+):\s*(.*)$", re.DOTALL)
_NOT_SLUG = re.compile(r"[^a-z0-9]+")
_WORD_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")

_STRING_PLACEHOLDERS = {
    "date-time": "2025-01-31T12:00:00.000Z",
    "date": "2025-01-31",
    "time": "12:00:00",
    "email": "user@example.com",
    "uri": "https://example.com",
    "url": "https://example.com",
    "uuid": "3fa85f64-5717-4562-b3fc-2c963f66afa6",
    "ipv4": "192.0.2.1",
    "ipv6": "2001:db8::1",
    "hostname": "example.com",
    "byte": "U3dhZ2dlcg==",
}


def register_docs_helpers(target: Blueprint | Flask) -> None:
    """Make the helpers available to every template of the app `target` is (or is registered on)."""
    if isinstance(target, Blueprint):
        target.add_app_template_global(api_reference, "api_reference")
        target.add_app_template_filter(doc_text, "doc_text")
        target.add_app_template_filter(doc_inline, "doc_inline")
    else:
        target.add_template_global(api_reference, "api_reference")
        target.add_template_filter(doc_text, "doc_text")
        target.add_template_filter(doc_inline, "doc_inline")


# --- Light formatting of descriptions ----------------------------------------------------------


def doc_inline(text: Any) -> Markup:
    """One line of description as HTML: everything escaped, then `code` and **bold** marked up."""
    if text is None or text == "":
        return Markup("")
    parts: list[str] = []
    for index, piece in enumerate(_CODE_SPAN.split(str(text))):
        if index % 2:
            parts.append(Markup("<code>{}</code>").format(piece))
        else:
            parts.append(_BOLD.sub(r"<strong>\1</strong>", str(escape(piece))))
    return Markup("".join(parts))  # noqa: S704 - built from escaped text and fixed tags only


def doc_text(text: Any) -> Markup:
    """A description as paragraphs (blank-line separated) and `- ` bullet lists."""
    if text is None:
        return Markup("")
    html = []
    for block in _blocks(str(text)):
        lines = block.splitlines()
        if _LIST_ITEM.match(lines[0]):
            items: list[str] = []
            for line in lines:
                if _LIST_ITEM.match(line):
                    items.append(_LIST_ITEM.sub("", line))
                else:
                    items[-1] += " " + line.strip()
            html.append(
                Markup("<ul>{}</ul>").format(
                    Markup("").join(Markup("<li>{}</li>").format(doc_inline(i)) for i in items)
                )
            )
        else:
            joined = " ".join(line.strip() for line in lines)
            html.append(Markup("<p>{}</p>").format(doc_inline(joined)))
    return Markup("\n").join(html)


def _blocks(text: str) -> list[str]:
    return [b.strip("\n") for b in re.split(r"\n[ \t]*\n", text.strip()) if b.strip()]


def _split_notes(text: str) -> tuple[str, list[dict]]:
    """Paragraphs opening with `**Label:**` become notes beside the prose (the credential line)."""
    prose, notes = [], []
    for block in _blocks(text or ""):
        match = _NOTE.match(block)
        if match:
            notes.append({"label": match.group(1).strip(), "text": match.group(2).strip()})
        else:
            prose.append(block)
    return "\n\n".join(prose), notes


# --- The reference -----------------------------------------------------------------------------


def api_reference(spec: Mapping, base_url: str = "") -> dict:
    """Everything docs.html shows, from the OpenAPI document `spec`; `base_url` (the site root the
    reader reached, e.g. `request.url_root`) prefixes a relative server URL in the curl examples."""
    return _Reference(spec, base_url).build()


class _Reference:
    def __init__(self, spec: Mapping, base_url: str) -> None:
        self.spec = spec
        self.components = spec.get("components") or {}
        servers = spec.get("servers") or [{"url": ""}]
        server = str(servers[0].get("url", ""))
        if "://" not in server:
            server = base_url.rstrip("/") + "/" + server.lstrip("/") if base_url else server
        self.server_url = server.rstrip("/")
        self.schemes = self.components.get("securitySchemes") or {}

    # $ref resolution

    def deref(self, node: Any, seen: tuple[str, ...] = ()) -> tuple[dict, str | None]:
        """`node` with `$ref`s followed (and a lone allOf merged); also the last component name."""
        name = None
        while isinstance(node, Mapping) and "$ref" in node:
            ref = str(node["$ref"])
            if not ref.startswith("#/") or ref in seen:
                return {}, name
            seen = (*seen, ref)
            target: Any = self.spec
            for part in ref[2:].split("/"):
                part = part.replace("~1", "/").replace("~0", "~")
                target = target.get(part) if isinstance(target, Mapping) else None
            name = ref.rsplit("/", 1)[-1]
            node = target
        if not isinstance(node, Mapping):
            return {}, name
        if node.get("allOf"):
            merged: dict = {}
            properties: dict = {}
            required: list = []
            for member in node["allOf"]:
                resolved, member_name = self.deref(member, seen)
                name = name or member_name
                properties.update(resolved.get("properties") or {})
                required += list(resolved.get("required") or [])
                merged.update(
                    {k: v for k, v in resolved.items() if k not in ("properties", "required")}
                )
            merged.update({k: v for k, v in node.items() if k != "allOf"})
            if properties:
                merged["properties"] = properties
            if required:
                merged["required"] = required
            return merged, name
        return dict(node), name

    # schemas

    def type_label(self, schema: Any, depth: int = 0) -> str:
        schema, _ = self.deref(schema)
        for combinator in ("oneOf", "anyOf"):
            if schema.get(combinator) and depth < _MAX_DEPTH:
                return " or ".join(self.type_label(s, depth + 1) for s in schema[combinator])
        kind = schema.get("type")
        if kind == "array" or "items" in schema:
            items = schema.get("items") or {}
            return "array of " + (
                self.type_label(items, depth + 1) if depth < _MAX_DEPTH else "any"
            )
        if kind == "object" or "properties" in schema or "additionalProperties" in schema:
            extra = schema.get("additionalProperties")
            if isinstance(extra, Mapping) and not schema.get("properties") and depth < _MAX_DEPTH:
                return "map of " + self.type_label(extra, depth + 1)
            return "object"
        if not kind:
            return "any"
        fmt = schema.get("format")
        return f"{kind} ({fmt})" if fmt else str(kind)

    def fields(
        self, schema: Any, mode: str, prefix: str = "", depth: int = 0, seen: tuple = ()
    ) -> list[dict]:
        """Rows for the properties of an object `schema`, nested objects as `parent.child` and
        array items as `parent[].child`; `mode` "request" drops readOnly, "response" writeOnly."""
        schema, name = self.deref(schema)
        if (name and name in seen) or depth > _MAX_DEPTH:
            return []
        seen = (*seen, name) if name else seen
        required = set(schema.get("required") or [])
        rows = []
        for prop_name, raw in (schema.get("properties") or {}).items():
            prop, _ = self.deref(raw)
            if mode == "request" and prop.get("readOnly"):
                continue
            if mode == "response" and prop.get("writeOnly"):
                continue
            full_name = prefix + str(prop_name)
            rows.append(self.field_row(full_name, prop, prop_name in required, depth))
            rows += self.children(prop, mode, full_name, depth, seen)
        return rows

    def children(self, prop: dict, mode: str, full_name: str, depth: int, seen: tuple):
        if prop.get("properties") or prop.get("allOf"):
            return self.fields(prop, mode, full_name + ".", depth + 1, seen)
        items, _ = self.deref(prop.get("items")) if "items" in prop else ({}, None)
        if items.get("properties") or items.get("allOf"):
            return self.fields(prop.get("items"), mode, full_name + "[].", depth + 1, seen)
        return []

    def field_row(self, name: str, raw: Any, required: bool, depth: int = 0) -> dict:
        schema, _ = self.deref(raw)
        return {
            "name": name,
            "depth": depth,
            "type": self.type_label(raw),
            "required": bool(required),
            "description": schema.get("description", ""),
            "constraints": self.constraints(schema),
            "example": _json_text(schema["example"]) if "example" in schema else None,
            "deprecated": bool(schema.get("deprecated")),
        }

    def constraints(self, schema: dict) -> list[dict]:
        """Validation keywords as `{label, terms}` chips; each value shown as code."""
        out = []

        def add(label: str, *values: Any) -> None:
            out.append({"label": label, "terms": [_json_text(v) for v in values]})

        items, _ = self.deref(schema.get("items")) if "items" in schema else ({}, None)
        enum = schema.get("enum") or items.get("enum")
        if enum:
            add("one of" if "enum" in schema else "each one of", *enum)
        for key, label in (
            ("minLength", "min length"),
            ("maxLength", "max length"),
            ("minItems", "min items"),
            ("maxItems", "max items"),
            ("minProperties", "min properties"),
            ("maxProperties", "max properties"),
            ("multipleOf", "multiple of"),
            ("pattern", "pattern"),
        ):
            if key in schema:
                add(label, schema[key])
        if "minimum" in schema:
            add(
                "greater than" if schema.get("exclusiveMinimum") is True else "minimum",
                schema["minimum"],
            )
        if "maximum" in schema:
            add(
                "less than" if schema.get("exclusiveMaximum") is True else "maximum",
                schema["maximum"],
            )
        if schema.get("uniqueItems"):
            add("unique items")
        if "default" in schema:
            add("default", schema["default"])
        if schema.get("nullable"):
            add("nullable")
        if schema.get("readOnly"):
            add("read-only")
        if schema.get("writeOnly"):
            add("write-only")
        return out

    def example(
        self, raw: Any, mode: str, depth: int = 0, seen: tuple = (), all_fields: bool = False
    ) -> Any:
        """A value for `raw`: its example, else default, else first enum value, else built from
        its properties or a placeholder. A request example keeps required fields and the optional
        ones that declare an example or default; a response example keeps every field."""
        schema, name = self.deref(raw)
        if "example" in schema:
            return schema["example"]
        if "default" in schema:
            return schema["default"]
        if schema.get("nullable"):
            # What may be absent is absent in an example with nothing better: a made-up time
            # in `disabledAt` beside `isActive: true` would contradict it.
            return None
        if schema.get("enum"):
            return schema["enum"][0]
        if (name and name in seen) or depth > _MAX_DEPTH:
            return {}
        seen = (*seen, name) if name else seen
        for combinator in ("oneOf", "anyOf"):
            if schema.get(combinator):
                return self.example(schema[combinator][0], mode, depth + 1, seen, all_fields)
        kind = schema.get("type")
        if kind == "array" or "items" in schema:
            return [self.example(schema.get("items") or {}, mode, depth + 1, seen, all_fields)]
        if kind == "object" or "properties" in schema or "additionalProperties" in schema:
            required = set(schema.get("required") or [])
            body = {}
            for prop_name, prop_raw in (schema.get("properties") or {}).items():
                prop, _ = self.deref(prop_raw)
                if prop.get("readOnly" if mode == "request" else "writeOnly"):
                    continue
                if all_fields or prop_name in required or "example" in prop or "default" in prop:
                    body[prop_name] = self.example(prop, mode, depth + 1, seen, all_fields)
            extra = schema.get("additionalProperties")
            if not body and isinstance(extra, Mapping):
                body["field"] = self.example(extra, mode, depth + 1, seen, all_fields)
            return body
        if kind == "string":
            return _STRING_PLACEHOLDERS.get(str(schema.get("format")), "string")
        if kind in ("integer", "number"):
            return schema.get("minimum", 0)
        if kind == "boolean":
            return True
        return None

    # operations

    def operations(self) -> list[dict]:
        ops = []
        for path, item in (self.spec.get("paths") or {}).items():
            item, _ = self.deref(item)
            shared = item.get("parameters") or []
            for method in HTTP_METHODS:
                if isinstance(item.get(method), Mapping):
                    ops.append(self.operation(path, method, item[method], shared))
        return ops

    def operation(self, path: str, method: str, op: Mapping, shared: list) -> dict:
        description, notes = _split_notes(op.get("description", ""))
        parameters = self.parameters([*shared, *(op.get("parameters") or [])])
        body = self.request_body(op.get("requestBody"))
        responses = op.get("responses") or {}
        codes = _success_codes(responses, method)
        success = self.success_response(responses, codes[0]) if codes else None
        also = [self.success_response(responses, code) for code in codes[1:]]
        security = op.get("security", self.spec.get("security")) or []
        op_id = op.get("operationId") or _slug(f"{method}-{path}")
        return {
            "id": op_id,
            "method": method.upper(),
            "path": path,
            "summary": op.get("summary") or op_id,
            "description": description,
            "notes": notes,
            "tags": list(op.get("tags") or []) or ["Operations"],
            "deprecated": bool(op.get("deprecated")),
            "credentials": self.credentials(security),
            "parameters": parameters,
            "body": body,
            "success": success,
            "errors": self.error_responses(responses),
            "curl": self.curl(method, path, parameters, body, security),
            "response_example": success["example"] if success else None,
            # Other successes (a postback's 200 replay beside its 201), each with its example.
            "other_successes": also,
        }

    def parameters(self, raw: list) -> list[dict]:
        by_key: dict[tuple, dict] = {}
        for item in raw:
            param, _ = self.deref(item)
            if not param.get("name"):
                continue
            schema, _ = self.deref(param.get("schema") or {})
            merged = {**schema, **{k: param[k] for k in ("description", "example") if k in param}}
            row = self.field_row(param["name"], merged, param.get("required", False))
            row["type"] = self.type_label(param.get("schema") or {})
            row["in"] = param.get("in", "")
            row["deprecated"] = bool(param.get("deprecated"))
            row["sample"] = self.example(merged, "request")
            by_key[(row["in"], row["name"])] = row  # operation-level overrides path-level
        order = {"path": 0, "query": 1, "header": 2, "cookie": 3}
        return sorted(by_key.values(), key=lambda r: order.get(r["in"], 4))

    def request_body(self, raw: Any) -> dict | None:
        if raw is None:
            return None
        body, _ = self.deref(raw)
        content = body.get("content") or {}
        if not content:
            return None
        media = "application/json" if "application/json" in content else next(iter(content))
        schema_raw = (content[media] or {}).get("schema") or {}
        schema, name = self.deref(schema_raw)
        fields = self.fields(schema_raw, "request")
        if not fields and not schema.get("properties"):
            fields = [self.field_row("(body)", schema_raw, True)]
        example = content[media].get("example")
        if example is None:
            example = self.example(schema_raw, "request")
        return {
            "media_type": media,
            "schema_name": name,
            "required": bool(body.get("required")),
            "description": body.get("description", ""),
            "fields": fields,
            "example": example,
            "is_json": "json" in media,
        }

    def success_response(self, responses: Mapping, code) -> dict:
        status = str(code)
        response, _ = self.deref(responses[code])
        content = response.get("content") or {}
        result = {
            "status": status,
            "description": response.get("description", ""),
            "media_type": None,
            "envelope": None,
            "data_type": None,
            "data_many": False,
            "fields": [],
            "example": None,
        }
        if not content:
            return result
        media = "application/json" if "application/json" in content else next(iter(content))
        schema_raw = (content[media] or {}).get("schema") or {}
        schema, envelope_name = self.deref(schema_raw)
        result["media_type"] = media
        data_raw = (schema.get("properties") or {}).get("data")
        if data_raw is not None:
            result["envelope"] = envelope_name or "envelope"
            data, _ = self.deref(data_raw)
            result["data_type"] = self.type_label(data_raw)
            result["data_many"] = data.get("type") == "array" or "items" in data
            target = data.get("items") if result["data_many"] else data_raw
            result["fields"] = self.fields(target, "response")
        else:
            result["data_type"] = self.type_label(schema_raw)
            result["fields"] = self.fields(schema_raw, "response")
        example = content[media].get("example")
        if example is None:
            example = self.example(schema_raw, "response", all_fields=True)
            if data_raw is not None and isinstance(example, dict):
                _fill_envelope(example, int(status), result["description"], success=True)
        result["example"] = _json_text(example, indent=2)
        return result

    def error_responses(self, responses: Mapping) -> list[dict]:
        out = []
        for status in sorted(responses, key=str):
            if str(status).startswith(("1", "2", "3")):
                continue
            response, name = self.deref(responses[status])
            code, text = _coded(response.get("description", ""))
            out.append({"status": str(status), "name": name, "code": code, "description": text})
        return out

    # credentials and curl

    def scheme_label(self, name: str) -> dict:
        """How a security scheme is sent: `{scheme, where, header, value}`."""
        scheme, _ = self.deref(self.schemes.get(name) or {})
        kind = scheme.get("type")
        variable = "$" + _env_name(name)
        if kind == "apiKey":
            where = scheme.get("in", "header")
            return {
                "scheme": name,
                "where": where,
                "header": scheme.get("name", name),
                "value": variable,
                "send_as": f"{scheme.get('name', name)}: {variable}"
                if where == "header"
                else f"{scheme.get('name', name)}={variable}",
            }
        if kind == "http" and str(scheme.get("scheme", "")).lower() == "basic":
            return {
                "scheme": name,
                "where": "basic",
                "header": "Authorization",
                "value": variable,
                "send_as": "Authorization: Basic …",
            }
        prefix = str(scheme.get("scheme") or "Bearer")
        prefix = prefix[:1].upper() + prefix[1:]
        return {
            "scheme": name,
            "where": "header",
            "header": "Authorization",
            "value": f"{prefix} {variable}",
            "send_as": f"Authorization: {prefix} …",
        }

    def credentials(self, security: list) -> list[list[dict]]:
        """Alternatives (any one suffices), each a list of schemes sent together."""
        return [[self.scheme_label(name) for name in requirement] for requirement in security]

    def curl(self, method: str, path: str, parameters: list, body: dict | None, security):
        query = []
        headers = []
        options = []
        for requirement in security[:1]:
            for name in requirement:
                sent = self.scheme_label(name)
                if sent["where"] == "query":
                    query.append(f"{sent['header']}={sent['value']}")
                elif sent["where"] == "cookie":
                    options.append(f'-b "{sent["header"]}={sent["value"]}"')
                elif sent["where"] == "basic":
                    options.append(f'-u "{sent["value"]}"')
                else:
                    headers.append(f"{sent['header']}: {sent['value']}")
        for param in parameters:
            if param["in"] == "query" and (param["required"] or param["example"] is not None):
                value = param["sample"]
                text = value if isinstance(value, str) else json.dumps(value)
                query.append(f"{quote(param['name'])}={quote(str(text), safe='')}")
            elif param["in"] == "header" and param["required"]:
                headers.append(f"{param['name']}: {_plain(param['sample'])}")
        url = self.server_url + path + ("?" + "&".join(query) if query else "")
        lines = [f'curl -X {method.upper()} "{url}"' if method != "get" else f'curl "{url}"']
        lines += [f'-H "{header}"' for header in headers]
        lines += options
        if body is not None:
            lines.append(f'-H "Content-Type: {body["media_type"]}"')
            if body["is_json"]:
                payload = _json_text(body["example"], indent=2).replace("\n", "\n  ")
            else:
                payload = _plain(body["example"])
            lines.append("-d '" + payload.replace("'", "'\\''") + "'")
        return " \\\n  ".join(lines)

    # page-wide sections

    def authentication(self, ops: list[dict]) -> list[dict]:
        used: dict[str, list[dict]] = {name: [] for name in self.schemes}
        for op in ops:
            for alternative in op["credentials"]:
                for sent in alternative:
                    used.setdefault(sent["scheme"], []).append(op)
        out = []
        for name in used:
            scheme, _ = self.deref(self.schemes.get(name) or {})
            out.append(
                {
                    **self.scheme_label(name),
                    "type": scheme.get("type", ""),
                    "description": scheme.get("description", ""),
                    "operations": [{"id": o["id"], "summary": o["summary"]} for o in used[name]],
                    "all": bool(ops) and len(used[name]) == len(ops),
                }
            )
        return out

    def envelopes(self, ops: list[dict]) -> dict:
        """The success envelope (union of the operations' envelope schemas) and the error one."""
        success_schemas: list[dict] = []
        error_schemas: list[tuple[str | None, dict]] = []
        for path_item in (self.spec.get("paths") or {}).values():
            path_item, _ = self.deref(path_item)
            for method in HTTP_METHODS:
                op = path_item.get(method)
                if not isinstance(op, Mapping):
                    continue
                for status, raw in (op.get("responses") or {}).items():
                    response, _ = self.deref(raw)
                    for media in (response.get("content") or {}).values():
                        schema, name = self.deref((media or {}).get("schema") or {})
                        if str(status).startswith("2") and "data" in (
                            schema.get("properties") or {}
                        ):
                            success_schemas.append(schema)
                        elif not str(status).startswith(("1", "2", "3")):
                            error_schemas.append((name, schema))
        for raw in (self.components.get("responses") or {}).values():
            response, _ = self.deref(raw)
            for media in (response.get("content") or {}).values():
                schema, name = self.deref((media or {}).get("schema") or {})
                error_schemas.append((name, schema))
        if not error_schemas and "ErrorEnvelope" in (self.components.get("schemas") or {}):
            error_schemas.append(("ErrorEnvelope", self.components["schemas"]["ErrorEnvelope"]))

        success_rows = self._merged_envelope(success_schemas)
        error_name, error_schema = next(
            ((n, s) for n, s in error_schemas if s.get("properties")), (None, {})
        )
        error_rows = self.fields(error_schema, "response") if error_schema else []
        return {
            "success": success_rows,
            "success_example": self._success_example(success_schemas),
            "error_name": error_name,
            "error": error_rows,
            "error_example": self._error_example(error_schema, ops),
            "codes": self.error_codes(error_schema, ops),
        }

    def _merged_envelope(self, schemas: list[dict]) -> list[dict]:
        names: list[str] = []
        for schema in schemas:
            names += [n for n in schema.get("properties", {}) if n not in names]
        rows = []
        for name in names:
            having = [s for s in schemas if name in s.get("properties", {})]
            raw = having[0]["properties"][name]
            required = all(name in (s.get("required") or []) for s in having)
            if name == "data":
                row = self.field_row(name, {}, required)
                row["type"] = "varies"
                row["description"] = (
                    "The operation's result: an object, or an array of them; "
                    "see each operation's response."
                )
                rows.append(row)
                continue
            row = self.field_row(name, raw, required)
            if len(having) < len(schemas):
                row["constraints"].insert(0, {"label": "on some operations", "terms": []})
                row["required"] = False
            rows.append(row)
            rows += self.children(self.deref(raw)[0], "response", name, 0, ())
        return rows

    def _success_example(self, schemas: list[dict]) -> str | None:
        if not schemas:
            return None
        example = self.example(schemas[0], "response", all_fields=True)
        if isinstance(example, dict):
            _fill_envelope(example, 200, "OK", success=True)
        return _json_text(example, indent=2)

    def _error_example(self, schema: dict, ops: list[dict]) -> str | None:
        if not schema:
            return None
        example = self.example(schema, "response", all_fields=True)
        if isinstance(example, dict):
            code = next((e for e in _first_errors(ops) if e["code"] == "VALIDATION_ERROR"), None)
            code = code or next(iter(_first_errors(ops)), None)
            if code:
                for key in ("errorCode", "error_code", "code"):
                    if key in example and isinstance(example[key], str):
                        example[key] = code["code"] or example[key]
                _fill_envelope(example, int(code["status"]), _sentence(code["description"]), False)
            else:
                _fill_envelope(example, 400, "Invalid request", success=False)
        return _json_text(example, indent=2)

    def error_codes(self, schema: dict, ops: list[dict]) -> list[dict]:
        """The `errorCode` enum, each with the HTTP status and meaning the responses give it."""
        known: dict[str, dict] = {}
        for error in _first_errors(ops):
            if error["code"]:
                known.setdefault(error["code"], error)
        for raw in (self.components.get("responses") or {}).values():
            response, _ = self.deref(raw)
            code, text = _coded(response.get("description", ""))
            if code and code not in known:
                known[code] = {"code": code, "status": "", "description": text}
        codes: list[str] = []
        for prop_name in ("errorCode", "error_code", "code"):
            prop, _ = self.deref((schema.get("properties") or {}).get(prop_name) or {})
            if prop.get("enum"):
                codes = [str(c) for c in prop["enum"]]
                break
        codes += [c for c in known if c not in codes]
        out = []
        for code in codes:
            entry = known.get(code, {})
            status = entry.get("status") or (
                str(HTTPStatus[code].value) if code in HTTPStatus.__members__ else ""
            )
            out.append(
                {"code": code, "status": status, "description": entry.get("description", "")}
            )
        return out

    def build(self) -> dict:
        ops = self.operations()
        tags: dict[str, dict] = {}
        for declared in self.spec.get("tags") or []:
            if declared.get("name"):
                tags[declared["name"]] = {
                    "name": declared["name"],
                    "description": declared.get("description", ""),
                    "operations": [],
                }
        for op in ops:
            tag = op["tags"][0]
            tags.setdefault(tag, {"name": tag, "description": "", "operations": []})
            tags[tag]["operations"].append(op)
        used_ids = {op["id"] for op in ops}
        groups = []
        for tag in tags.values():
            if not tag["operations"]:
                continue
            tag["operations"].sort(key=_kind_rank)
            anchor = "tag-" + _slug(tag["name"])
            while anchor in used_ids:
                anchor += "-"
            tag["anchor"] = anchor
            groups.append(tag)
        info = self.spec.get("info") or {}
        return {
            "title": info.get("title", "API reference"),
            "version": info.get("version", ""),
            "description": info.get("description", ""),
            "license": (info.get("license") or {}).get("name", ""),
            "openapi": self.spec.get("openapi", ""),
            "server_url": self.server_url,
            "tags": groups,
            "operation_count": len(ops),
            "authentication": self.authentication([o for g in groups for o in g["operations"]]),
            "envelope": self.envelopes(ops),
            "callbacks": self.callbacks(),
        }

    def callbacks(self) -> list[dict]:
        """Requests the service sends (OpenAPI callbacks: webhook deliveries), with their
        headers and one example body per named example (per event)."""
        found = []
        for path_item in (self.spec.get("paths") or {}).values():
            for op in path_item.values():
                if not isinstance(op, Mapping):
                    continue
                for name, callback in (op.get("callbacks") or {}).items():
                    for expression, item in callback.items():
                        for method, request in item.items():
                            found.append(self._callback(name, expression, method, request))
        return found

    def _callback(self, name: str, expression: str, method: str, request: Mapping) -> dict:
        body = (request.get("requestBody") or {}).get("content", {}).get("application/json", {})
        schema, schema_name = self.deref(body.get("schema") or {})
        return {
            "anchor": "callback-" + _slug(name),
            "summary": request.get("summary") or name,
            "description": request.get("description", ""),
            "method": method.upper(),
            "target": expression,
            "headers": [
                {"name": p.get("name"), "description": p.get("description", "")}
                for p in request.get("parameters") or []
                if p.get("in") == "header"
            ],
            "fields": self.fields(schema, mode="request") if schema else [],
            "schema_name": schema_name,
            "examples": [
                {
                    "name": example_name,
                    "anchor": "event-" + _slug(example_name),
                    "summary": example.get("summary", ""),
                    "body": _json_text(example.get("value"), indent=2),
                }
                for example_name, example in (body.get("examples") or {}).items()
            ],
        }


# --- small helpers ------------------------------------------------------------------------------


def _kind_rank(op: dict) -> int:
    """Where an operation stands in its group: see `_LIST`."""
    method, success = op["method"], op["success"]
    if method == "GET":
        return _LIST if success and _is_list(success) else _GET
    if method == "POST":
        return _CREATE if success and success["status"] == "201" else _ACTION
    if method in ("PUT", "PATCH"):
        return _UPDATE
    return _DELETE if method == "DELETE" else _ACTION


def _is_list(success: dict) -> bool:
    """Its data is an array, or an object holding just one (`{"endpoints": [...]}`)."""
    if success["data_many"]:
        return True
    top = [row for row in success["fields"] if row["depth"] == 0]
    return len(top) == 1 and top[0]["type"].startswith("array")


def _success_codes(responses: Mapping, method: str) -> list:
    """The 2xx codes, the one to show first leading: a POST's 201 (what a new record answers;
    a 200 beside it is the exception, such as a replay), else the lowest."""

    def rank(code) -> tuple[int, str]:
        return (0 if method == "post" and str(code) == "201" else 1, str(code))

    return sorted((c for c in responses if str(c).startswith("2")), key=rank)


def _first_errors(ops: list[dict]):
    for op in ops:
        yield from op["errors"]


def _coded(description: str) -> tuple[str | None, str]:
    """`VALIDATION_ERROR: the body is invalid` -> ("VALIDATION_ERROR", "the body is invalid")."""
    match = _CODED_DESCRIPTION.match(description or "")
    if match:
        return match.group(1), match.group(2)
    return None, description or ""


def _sentence(text: str) -> str:
    text = _CODE_SPAN.sub(r"\1", text).split(";")[0].strip().rstrip(".")
    return text[:1].upper() + text[1:]


def _fill_envelope(example: dict, status: int, message: str, success: bool) -> None:
    """Envelope fields made consistent with the response they stand for."""
    for key, value in (
        ("status", success),
        ("statusCode", status),
        ("status_code", status),
        ("message", message),
        ("requestId", "req_0f561f9c45be8f55502128f4"),
        ("request_id", "req_0f561f9c45be8f55502128f4"),
    ):
        if key in example and (key != "status" or isinstance(example[key], bool)):
            example[key] = value


def _json_text(value: Any, indent: int | None = None) -> str:
    """A value as JSON: on one line, or (`indent`) pretty with short lists of scalars kept on one
    line; a bare string as itself when unambiguous."""
    if indent is None:
        if isinstance(value, str) and value and value.strip() == value:
            return value
        return json.dumps(value, ensure_ascii=False)
    return _pretty(value, indent, 0)


def _pretty(value: Any, indent: int, level: int) -> str:
    pad, inner = " " * indent * level, " " * indent * (level + 1)
    one_line = json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        if not value or (
            all(not isinstance(v, dict | list) for v in value) and len(one_line) <= 60
        ):
            return one_line
        items = ",\n".join(inner + _pretty(v, indent, level + 1) for v in value)
        return "[\n" + items + "\n" + pad + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = ",\n".join(
            inner + json.dumps(str(k), ensure_ascii=False) + ": " + _pretty(v, indent, level + 1)
            for k, v in value.items()
        )
        return "{\n" + items + "\n" + pad + "}"
    return one_line


def _plain(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _slug(text: str) -> str:
    return _NOT_SLUG.sub("-", str(text).lower()).strip("-") or "section"


def _env_name(scheme: str) -> str:
    """`ApiKey` -> `API_KEY`, `BootstrapToken` -> `BOOTSTRAP_TOKEN`, `Bearer` -> `BEARER_TOKEN`."""
    name = _NOT_SLUG.sub("_", _WORD_BOUNDARY.sub("_", scheme).lower()).strip("_").upper() or "TOKEN"
    if not name.endswith(("KEY", "TOKEN", "SECRET", "PASSWORD")):
        name += "_TOKEN"
    return name
