"""Placeholder: being built (dashboard issue 6)."""

from blueprints.dashboard import dashboard
from blueprints.dashboard.session import signed_in


@dashboard.get("/conversions")
@signed_in()
def conversions():
    return "conversions"


@dashboard.get("/links")
@signed_in()
def links():
    return "links"
