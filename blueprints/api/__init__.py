"""The JSON API under /api/v1. Each resource module adds its routes to `api`."""

from flask import Blueprint
from flask.sansio.blueprints import BlueprintSetupState
from werkzeug.routing import BaseConverter

from models.columns import id_pattern

API_PREFIX = "/api/v1"

api = Blueprint("api", __name__, url_prefix=API_PREFIX)


class IdConverter(BaseConverter):
    """`<id(whe):endpoint_id>`: a path segment that is an id of that type (`whe_…`), and nothing
    else. A URL that holds no such id is no route's: `/conversion/record-postback` is never read
    as a conversion id, so its `Allow` header and its 405s name only the methods that path has."""

    def __init__(self, url_map, prefix: str) -> None:
        super().__init__(url_map)
        self.prefix = prefix
        self.regex = id_pattern(prefix)


def add_id_converter(state: BlueprintSetupState) -> None:
    state.app.url_map.converters.setdefault("id", IdConverter)


# Recorded before any route, so the converter is on the app's map when the routes are added.
api.record_once(add_id_converter)


def register_routes() -> Blueprint:
    # Imported for their side effect of adding routes; kept here so the route table is one list.
    from blueprints.api import (  # noqa: F401
        conversions,
        events,
        keys,
        openapi,
        platform_data,
        webhooks,
    )

    return api
