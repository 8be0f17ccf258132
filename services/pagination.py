"""One way to page a list (CONTRACT section 3): `page` from 1, `limit` 1-100, and the meta."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, func, select

from extensions import db

DEFAULT_LIMIT = 20
MAX_LIMIT = 100


@dataclass(frozen=True)
class Page:
    items: list[Any]
    page: int
    limit: int
    total: int

    @property
    def total_pages(self) -> int:
        return math.ceil(self.total / self.limit) if self.total else 0

    @property
    def has_next(self) -> bool:
        return self.page < self.total_pages


def paginate(statement: Select, *, page: int, limit: int, scalars: bool = True) -> Page:
    """Run `statement` (already ordered) for one page, and count all its rows."""
    total = db.session.scalar(select(func.count()).select_from(statement.order_by(None).subquery()))
    paged = statement.limit(limit).offset((page - 1) * limit)
    result = db.session.scalars(paged) if scalars else db.session.execute(paged)
    return Page(items=list(result), page=page, limit=limit, total=total or 0)
