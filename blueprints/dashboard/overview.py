"""Overview: the workspace, the last day's deliveries by status, endpoints needing attention."""

from __future__ import annotations

from datetime import timedelta

from blueprints.dashboard import dashboard
from blueprints.dashboard.rendering import render
from blueprints.dashboard.session import current_caller, signed_in
from models.columns import utcnow
from schemas.webhooks import DeliverySchema, EndpointSchema
from schemas.workspace import WorkspaceSchema
from services.deliveries import count_deliveries_by_status, list_deliveries
from services.webhook_endpoints import endpoints_needing_attention_first, list_endpoints
from services.workspace import get_workspace

RECENT = timedelta(hours=24)
RECENT_FAILURES = 5

_workspace = WorkspaceSchema()
_endpoints = EndpointSchema(many=True)
_deliveries = DeliverySchema(many=True)


@dashboard.get("/")
@signed_in()
def overview():
    caller = current_caller()
    brand_id = caller.brand_id
    failed = list_deliveries(brand_id=brand_id, page=1, limit=RECENT_FAILURES, status="failed")
    return render(
        "dashboard/overview.html",
        workspace=_workspace.dump(
            get_workspace(brand_id=brand_id, key_id=caller.key_id, scopes=caller.scopes)
        ),
        counts=count_deliveries_by_status(brand_id, since=utcnow() - RECENT),
        endpoints=_endpoints.dump(endpoints_needing_attention_first(list_endpoints(brand_id))),
        recent_failures=_deliveries.dump(failed.items),
    )
