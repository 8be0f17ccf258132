"""Placeholder: being built (dashboard issue 6)."""

from blueprints.dashboard import dashboard
from blueprints.dashboard.session import signed_in


@dashboard.get("/events")
@signed_in()
def events():
    return "events"
