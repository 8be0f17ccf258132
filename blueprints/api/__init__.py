"""The JSON API under /api/v1. Each resource module adds its routes to `api`."""

from flask import Blueprint

API_PREFIX = "/api/v1"

api = Blueprint("api", __name__, url_prefix=API_PREFIX)


def register_routes() -> Blueprint:
    # Imported for their side effect of adding routes; kept here so the route table is one list.
    from blueprints.api import conversions, keys, openapi, platform_data, webhooks  # noqa: F401

    return api
