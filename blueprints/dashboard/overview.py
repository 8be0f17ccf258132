"""Overview: the workspace, what its webhooks are doing (the last day's deliveries, the ones
retrying now, the attempts that failed), and its endpoints."""

from __future__ import annotations

from datetime import timedelta
from typing import cast

from blueprints.dashboard import dashboard
from blueprints.dashboard.rendering import render
from blueprints.dashboard.session import current_caller, signed_in
from models.columns import utcnow
from schemas.webhooks import DeliverySchema, EndpointSchema
from schemas.workspace import WorkspaceSchema
from services.deliveries import delivery_health, list_deliveries
from services.webhook_endpoints import list_endpoints
from services.workspace import get_workspace

RECENT = timedelta(hours=24)
LISTED = 5

_workspace = WorkspaceSchema()
_endpoints = EndpointSchema(many=True)
_deliveries = DeliverySchema(many=True)


@dashboard.get("/")
@signed_in()
def overview():
    caller = current_caller()
    brand_id = caller.brand_id
    retrying = list_deliveries(brand_id=brand_id, page=1, limit=LISTED, retrying=True)
    failed = list_deliveries(brand_id=brand_id, page=1, limit=LISTED, status="failed")
    endpoints = _endpoints.dump(list_endpoints(brand_id))
    return render(
        "dashboard/overview.html",
        workspace=_workspace.dump(
            # A dashboard session is an API key's.
            get_workspace(brand_id=brand_id, key_id=cast(str, caller.key_id), scopes=caller.scopes)
        ),
        health=delivery_health(brand_id, since=utcnow() - RECENT),
        endpoints=endpoints,
        # The lists name each delivery's endpoint; a deleted one is absent.
        endpoints_by_id={endpoint["id"]: endpoint for endpoint in endpoints},
        retrying=_deliveries.dump(retrying.items),
        recent_failures=_deliveries.dump(failed.items),
    )
