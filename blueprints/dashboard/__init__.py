"""The developer dashboard at /dashboard (CONTRACT section 7): server-rendered pages with htmx.

Like the JSON API it only parses input, calls the services, and renders; every rule it applies
is the same function the API calls. Each page module adds its routes to `dashboard`.
"""

from flask import Blueprint

from blueprints.api import add_id_converter

DASHBOARD_PREFIX = "/dashboard"

dashboard = Blueprint(
    "dashboard", __name__, url_prefix=DASHBOARD_PREFIX, template_folder="../../templates"
)
# Ids in paths are read as the API reads them (`<id(whe):endpoint_id>`): a segment that is no
# id of that type is no page's, a 404 before any view or query runs.
dashboard.record_once(add_id_converter)


def register_dashboard() -> Blueprint:
    # Imported for their side effect of adding routes; kept here so the page table is one list.
    from blueprints.dashboard import (  # noqa: F401
        deliveries,
        endpoints,
        event_log,
        events,
        formatting,
        keys,
        overview,
        records,
        search,
        sign_in,
    )

    return dashboard
