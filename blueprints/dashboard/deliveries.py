"""Placeholder: being built (dashboard issue 6)."""

from blueprints.dashboard import dashboard
from blueprints.dashboard.session import signed_in


@dashboard.get("/deliveries")
@signed_in()
def deliveries():
    return "deliveries"


@dashboard.get("/deliveries/<delivery_id>")
@signed_in()
def delivery(delivery_id: str):
    return "delivery"
