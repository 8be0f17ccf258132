"""Find a record by the id a developer has in hand (from a receiver's log, an API answer or a
support ticket): a delivery, an event, a conversion or an endpoint of the session's brand.

A known id of the brand goes straight to its page (an event to its body and deliveries);
anything else stays on the search page (a 200, like any search that finds nothing) saying what
was wrong, and never reveals another brand's records.
"""

from __future__ import annotations

import re

from flask import redirect, request, url_for

from blueprints.dashboard import dashboard
from blueprints.dashboard.rendering import render
from blueprints.dashboard.session import current_caller, signed_in
from models.columns import id_pattern
from services.conversions import get_conversion
from services.deliveries import get_delivery
from services.errors import NotFound
from services.event_feed import get_event
from services.webhook_endpoints import get_endpoint


def _delivery(brand_id: str, found: str) -> str:
    get_delivery(brand_id, found)
    return url_for("dashboard.delivery", delivery_id=found)


def _event(brand_id: str, found: str) -> str:
    get_event(brand_id, found)
    return url_for("dashboard.event", event_id=found)


def _conversion(brand_id: str, found: str) -> str:
    get_conversion(brand_id, found)
    return url_for("dashboard.conversion", conversion_id=found)


def _endpoint(brand_id: str, found: str) -> str:
    get_endpoint(brand_id, found)
    return url_for("dashboard.endpoint", endpoint_id=found)


# id prefix -> (what it names, where it leads)
KINDS = {
    "whd": ("delivery", _delivery),
    "evt": ("event", _event),
    "conv": ("conversion", _conversion),
    "whe": ("endpoint", _endpoint),
}
# The form of each kind's ids, as the router reads them in paths (`models.columns.id_pattern`).
_ID_FORMS = {prefix: re.compile(id_pattern(prefix)) for prefix in KINDS}


@dashboard.get("/search")
@signed_in()
def search():
    query = request.args.get("q", "").strip()
    if not query:
        return render("dashboard/search.html", query="", problem=None)
    kind = next(
        (KINDS[prefix] for prefix, form in _ID_FORMS.items() if form.fullmatch(query)), None
    )
    if kind is None:
        problem = (
            "That is not an id the dashboard can look up: paste a delivery (whd_…), event "
            "(evt_…), conversion (conv_…) or endpoint (whe_…) id."
        )
        return render("dashboard/search.html", query=query, problem=problem)
    name, destination = kind
    try:
        return redirect(destination(current_caller().brand_id, query), code=303)
    except NotFound:
        problem = f"No {name} with id {query} in this brand."
        return render("dashboard/search.html", query=query, problem=problem)
