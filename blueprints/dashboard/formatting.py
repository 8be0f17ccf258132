"""How values read on the dashboard: times, long tokens, endpoint URLs in a line, and a
delivery's state.

Times: the absolute UTC time to the second (in `<time datetime>` and its title), and beside it
how long ago or how soon, "2 h ago", "in 4 min", counted from when the page was drawn.
static/dashboard.js (`relativeTime`) keeps that phrase current on a page left open, by the same
rules.

Long tokens (URLs, ids, idempotency keys) have no spaces: a browser either overflows its box
with them or, told to break anywhere, cuts "webhooks" into "we" and "bhooks". `breakable` marks
the places a reader expects a break, after a slash or a dash say, and the stylesheet breaks
elsewhere only when one segment alone is wider than its box. Where a URL must fit one line (a
list naming endpoints), `brief_url` keeps what tells endpoints apart, the host and the path's
ends; the whole URL goes in a title beside it.

A delivery's state reads the same on every page: `delivery_state` (services/deliveries.py)
names it, here from the API's dump of the delivery (`status`, `retrying`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from urllib.parse import urlsplit

from markupsafe import Markup, escape

from blueprints.dashboard import dashboard
from models.columns import utcnow
from services.deliveries import delivery_state

MINUTE, HOUR, DAY = 60, 3600, 86400
# After these a long token may break: path and query separators, and the dashes and
# underscores of ids and keys (`whe_01…`, `order-20931-purchase`).
BREAK_AFTER = re.compile(r"([/?&=_\-.:,]+)")
# How long `brief_url` lets a URL be before it leaves out the middle of its path.
BRIEF_URL_LENGTH = 40


def relative_time(moment: datetime, now: datetime) -> str:
    """ "just now", "in under a minute", "12 min ago", "in 4 min", "5 h ago", "3 d ago": whole
    units, rounded down, minutes below an hour, hours below two days."""
    seconds = (moment - now).total_seconds()
    span = abs(seconds)
    if span < MINUTE:
        return "just now" if seconds <= 0 else "in under a minute"
    if span < HOUR:
        amount = f"{int(span // MINUTE)} min"
    elif span < 2 * DAY:
        amount = f"{int(span // HOUR)} h"
    else:
        amount = f"{int(span // DAY)} d"
    return f"{amount} ago" if seconds < 0 else f"in {amount}"


@dashboard.app_template_filter("ago")
def ago(value: str | None) -> str:
    """An API timestamp ("2026-11-25T17:41:21.000Z") as `relative_time` from now."""
    if not value:
        return ""
    return relative_time(datetime.fromisoformat(value), utcnow())


@dashboard.app_template_filter("breakable")
def breakable(value: str | None) -> Markup:
    """`value`, escaped, with a line-break opportunity (<wbr>) after each separator."""
    if not value:
        return Markup("")
    parts = BREAK_AFTER.split(str(value))
    return Markup("").join(
        escape(part) + (Markup("<wbr>") if index % 2 else Markup(""))
        for index, part in enumerate(parts)
    )


@dashboard.app_template_filter("brief_url")
def brief_url(url: str | None, limit: int = BRIEF_URL_LENGTH) -> str:
    """`url` in a line: without its scheme; past `limit` characters without its query ("?…")
    and then the middle of its path ("/…/"), never without its host or its path's first and last
    segments, which tell one endpoint from another."""
    if not url:
        return ""
    parts = urlsplit(url)
    whole = parts.netloc + parts.path + (f"?{parts.query}" if parts.query else "")
    if len(whole) <= limit:
        return whole
    query = "?…" if parts.query else ""
    segments = parts.path.strip("/").split("/")
    path = parts.path
    if len(parts.netloc + path + query) > limit and len(segments) > 2:
        path = f"/{segments[0]}/…/{segments[-1]}" + ("/" if parts.path.endswith("/") else "")
    return parts.netloc + path + query


@dashboard.app_template_filter("delivery_state")
def delivery_state_of(delivery: Mapping) -> str:
    """A delivery as the API dumps it, in the dashboard's words: waiting, retrying, delivered
    or failed."""
    return delivery_state(
        delivery["status"], delivery["retrying"], delivery.get("heldBehind") is not None
    )
