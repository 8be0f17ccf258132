"""Placeholder: being built (dashboard issue 6)."""

from blueprints.dashboard import dashboard
from blueprints.dashboard.session import signed_in


@dashboard.get("/endpoints")
@signed_in()
def endpoints():
    return "endpoints"


@dashboard.get("/endpoints/<endpoint_id>")
@signed_in()
def endpoint(endpoint_id: str):
    return "endpoint"
