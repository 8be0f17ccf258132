"""`paginate`: exact totals while counting is cheap, an honest lower bound beyond, and a
`hasNext` that is always right."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from models import Brand
from services import pagination
from services.pagination import paginate


@pytest.fixture
def twelve_brands(app, make_brand):
    for number in range(12):
        make_brand(name=f"Brand {number:02d}")
    return select(Brand).order_by(Brand.name)


def page_of(app, statement, page, limit):
    with app.app_context():
        result = paginate(statement, page=page, limit=limit)
        return result, [brand.name for brand in result.items]


def test_small_lists_have_exact_totals_and_pages(app, twelve_brands):
    first, names = page_of(app, twelve_brands, 1, 5)
    assert names == [f"Brand {n:02d}" for n in range(5)]
    assert (first.total, first.total_pages, first.has_next, first.total_exact) == (
        12,
        3,
        True,
        True,
    )
    last, names = page_of(app, twelve_brands, 3, 5)
    assert names == ["Brand 10", "Brand 11"]
    assert (last.has_next, last.total_exact) == (False, True)


def test_a_page_past_the_end_is_empty_not_an_error(app, twelve_brands):
    beyond, names = page_of(app, twelve_brands, 9, 5)
    assert names == [] and beyond.total == 12 and not beyond.has_next


def test_an_empty_list_is_a_success_with_zero_pages(app):
    empty, names = page_of(app, select(Brand).where(Brand.name == "nobody"), 1, 20)
    assert (names, empty.total, empty.total_pages, empty.has_next) == ([], 0, 0, False)


def test_counting_stops_at_the_limit_and_says_so(app, twelve_brands, monkeypatch):
    monkeypatch.setattr(pagination, "COUNT_LIMIT", 6)
    first, names = page_of(app, twelve_brands, 1, 5)
    assert len(names) == 5
    assert (first.total, first.total_exact, first.has_next) == (6, False, True)
    # A page deeper than the bound is still counted far enough to know what follows it.
    deep, names = page_of(app, twelve_brands, 2, 5)
    assert names == [f"Brand {n:02d}" for n in range(5, 10)]
    assert (deep.total, deep.total_exact, deep.has_next) == (10, False, True)
    last, names = page_of(app, twelve_brands, 3, 5)
    assert names == ["Brand 10", "Brand 11"]
    assert (last.total, last.total_exact, last.has_next) == (12, True, False)
