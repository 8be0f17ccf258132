"""One way to page a list (CONTRACT section 3): `page` from 1, `limit` 1-100, and the meta.

Counting every matching row is what makes a paged list slow on a big table: the page itself is
an index range scan of `limit` rows, but an exact `count(*)` of a brand's million deliveries
reads a million index entries (about 90 ms on PostgreSQL here). So rows are counted only up to
COUNT_LIMIT past the start of the list (or past the requested page, if deeper): below that
`total` is exact, above it `total` is that lower bound and `totalExact` is false, the way
GitLab shows "10,000+". `hasNext` is always exact.

A page at or past COUNT_LIMIT is read with one row more than it shows, and that read is the
count: the rows before it are known to exist (it starts after them), and the extra row says
whether more follow. So a deep page walks the index once, not twice (once to count, once to
skip); only a page past the end of the list counts, to say where the list ends.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Select, func, literal, select

from extensions import db

COUNT_LIMIT = 10_000


@dataclass(frozen=True)
class Page:
    items: list[Any]
    page: int
    limit: int
    total: int
    total_exact: bool = True

    @property
    def total_pages(self) -> int:
        return math.ceil(self.total / self.limit) if self.total else 0

    @property
    def has_next(self) -> bool:
        # Not exact means rows beyond this page were seen when counting.
        return not self.total_exact or self.page * self.limit < self.total


def paginate(
    statement: Select | Callable[[int, int], Select],
    *,
    page: int,
    limit: int,
    count: Select | None = None,
) -> Page:
    """Run `statement` (already ordered) for one page, and count its rows (see above).

    A list that must place its own OFFSET and LIMIT (inside a subquery, say) passes instead a
    function of (offset, limit) returning the page's statement, and as `count` the statement
    whose rows are counted.
    """
    offset = (page - 1) * limit
    # One row more than the page: whether another follows it.
    if callable(statement):
        page_statement = statement(offset, limit + 1)
    else:
        page_statement = statement.limit(limit + 1).offset(offset)
    items = list(db.session.scalars(page_statement))
    more = len(items) > limit
    del items[limit:]
    if items and offset + limit >= COUNT_LIMIT:
        # Deep: the page is the count (see above).
        return Page(
            items=items,
            page=page,
            limit=limit,
            total=offset + len(items),
            total_exact=not more,
        )
    count_up_to = max(COUNT_LIMIT, offset + limit) + 1
    # A function of (offset, limit) always comes with its `count`.
    counted_statement = count if count is not None else cast(Select, statement)
    counted = db.session.execute(
        select(func.count()).select_from(
            counted_statement.with_only_columns(literal(1), maintain_column_froms=True)
            .order_by(None)
            .limit(count_up_to)
            .subquery()
        )
    ).scalar_one()
    exact = counted < count_up_to
    # Above the bound, one more row than the bound is known to exist: say so with `hasNext`
    # while the total stays the honest lower bound.
    total = counted if exact else counted - 1
    return Page(items=items, page=page, limit=limit, total=total, total_exact=exact)
