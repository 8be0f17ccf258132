"""How dashboard views answer: a whole page, or for htmx the fragment it asked for; and how
form input is read through the same marshmallow schemas as the JSON API."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from urllib.parse import urlencode

from flask import render_template, request
from marshmallow import Schema, ValidationError, fields

from blueprints.api.operations import flatten_errors
from blueprints.dashboard.session import is_htmx
from services.errors import ValidationFailed


def whole_page_wanted() -> bool:
    """Whether `render` answers this request with the whole page even when it names a fragment:
    a browser navigating, or htmx restoring a page from history (the back button)."""
    return not is_htmx() or request.headers.get("HX-History-Restore-Request") == "true"


def render(page: str, *, fragment: str | None = None, status: int = 200, **context):
    """`page` for a browser navigating; `fragment` (a template the page includes) for htmx,
    followed by the flash messages, which htmx swaps into the page's flash region."""
    if fragment is None or whole_page_wanted():
        return render_template(page, **context), status
    body = render_template(fragment, **context) + render_template(
        "dashboard/_flashes.html", oob=True
    )
    return body, status


def render_confirmation(confirmation: dict, *, back: str):
    """The page a destructive button opens without JavaScript: what it does, and the POST that
    does it. `confirmation` holds title, consequence, button and action (the POST's URL)."""
    return render("dashboard/confirm.html", confirm=confirmation | {"back": back})


def load_form(schema: Schema) -> dict:
    """The form's fields as the schema loads them: a list field from its repeated inputs
    (checkboxes; none ticked is an empty list), a yes/no field from its checkbox, a number
    field as its number, any other field as its single value when sent.

    :raise ValidationFailed: with the API's per-field errors.
    """
    data: dict[str, object] = {}
    for name, field in schema.fields.items():
        key = field.data_key or name
        if isinstance(field, fields.List):
            data[key] = request.form.getlist(key)
        elif key not in request.form:
            continue
        elif isinstance(field, fields.Boolean):
            # A checkbox beside a hidden input of its name: "false" says the form has the
            # field, the checkbox's "true" that it is ticked.
            data[key] = "true" in request.form.getlist(key)
        elif isinstance(field, fields.Integer):
            data[key] = _form_number(request.form[key])
        else:
            data[key] = request.form[key]
    return load(schema, data)


def _form_number(value: str) -> int | str | None:
    """A number input's text as the JSON number it stands for; empty is none (null), and
    anything else is left for the schema to refuse."""
    text = value.strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        return value


def chosen_filters(names: Iterable[str]) -> dict[str, str]:
    """The filters the URL gave (an empty value is not given) and `limit`: what refills a
    list's filter form and its page links."""
    return {name: request.args[name] for name in (*names, "limit") if request.args.get(name)}


def render_list(
    page: str,
    *,
    fragment: str,
    query_schema: Schema,
    fetch: Callable[[dict], dict],
    **context,
):
    """A filtered list. Its query is read by the API's own query schema; one it refuses answers
    422 with each field's message in the results region (htmx swaps 422, so the message shows
    where the list was) and no rows. Otherwise `fetch(query)` gives what the list adds to
    `context`, which holds the empty list's values."""
    try:
        query = load_query(query_schema)
    except ValidationFailed as error:
        answer = render(page, fragment=fragment, status=422, **context | {"errors": error.errors})
    else:
        answer = render(page, fragment=fragment, **context | {"errors": {}} | fetch(query))
    return (*answer, _shareable_url())


def _shareable_url() -> dict[str, str]:
    """A filter form sends its empty fields too (`?status=&eventName=`); the URL htmx pushes to
    the address bar is the same query without them, the one worth sharing."""
    sent = list(request.args.items(multi=True))
    given = [(name, value) for name, value in sent if value != ""]
    if not is_htmx() or len(given) == len(sent):
        return {}
    return {"HX-Push-Url": request.path + (f"?{urlencode(given)}" if given else "")}


def load_query(schema: Schema) -> dict:
    """Query parameters through the API's query schema; empty values mean 'not given'."""
    return load(schema, {k: v for k, v in request.args.items() if v != ""})


def load(schema: Schema, data: dict) -> dict:
    try:
        return schema.load(data)
    except ValidationError as error:
        raise ValidationFailed(
            "Please correct the highlighted fields", flatten_errors(error.messages)
        ) from None
