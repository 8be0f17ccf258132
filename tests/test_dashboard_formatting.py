"""How the dashboard writes times and long tokens (blueprints/dashboard/formatting.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from blueprints.dashboard.formatting import (
    breakable,
    brief_url,
    delivery_state_of,
    relative_time,
)

NOW = datetime(2026, 11, 25, 17, 41, 21, tzinfo=UTC)


@pytest.mark.parametrize(
    ("offset", "said"),
    [
        (timedelta(0), "just now"),
        (-timedelta(seconds=59), "just now"),
        (timedelta(seconds=30), "in under a minute"),
        (-timedelta(seconds=60), "1 min ago"),
        (timedelta(minutes=4, seconds=59), "in 4 min"),
        (-timedelta(minutes=59, seconds=59), "59 min ago"),
        (-timedelta(hours=2, minutes=30), "2 h ago"),
        (timedelta(hours=47), "in 47 h"),
        (-timedelta(days=2), "2 d ago"),
        (-timedelta(days=29, hours=23), "29 d ago"),
    ],
)
def test_relative_times_count_whole_units_rounded_down(offset, said):
    assert relative_time(NOW + offset, NOW) == said


def test_long_tokens_may_break_after_separators_only_and_are_escaped():
    assert str(breakable("http://127.0.0.1:9/orders/hooks?a=1&b=2")) == (
        "http://<wbr>127.<wbr>0.<wbr>0.<wbr>1:<wbr>9/<wbr>orders/<wbr>hooks?<wbr>a=<wbr>1&amp;<wbr>b=<wbr>2"
    )
    assert str(breakable("order-20931_purchase")) == "order-<wbr>20931_<wbr>purchase"
    assert str(breakable("<script>x</script>")) == "&lt;script&gt;x&lt;/<wbr>script&gt;"
    assert str(breakable(None)) == ""


@pytest.mark.parametrize(
    ("url", "brief"),
    [
        ("http://127.0.0.1:8000/hooks", "127.0.0.1:8000/hooks"),
        ("https://api.example.com/webhooks/brand?team=1", "api.example.com/webhooks/brand?team=1"),
        # Too long: the query goes first, then the middle of the path; never the host, nor
        # the path's first and last segments, which tell endpoints apart.
        (
            "https://api.example.com/webhooks/brand/orders?source=brand-api&version=2026-11",
            "api.example.com/webhooks/brand/orders?…",
        ),
        (
            "http://127.0.0.1:9/orders-service/webhooks/production/eu-west-1/incoming?a=1",
            "127.0.0.1:9/orders-service/…/incoming?…",
        ),
        (
            "https://a-very-long-host-name.orders.internal.example.com/x/y/z",
            "a-very-long-host-name.orders.internal.example.com/x/…/z",
        ),
        (None, ""),
    ],
)
def test_a_brief_url_keeps_the_host_and_the_ends_of_its_path(url, brief):
    assert brief_url(url) == brief


@pytest.mark.parametrize(
    ("status", "retrying", "state"),
    [
        ("pending", False, "waiting"),
        ("pending", True, "retrying"),
        ("delivered", False, "delivered"),
        ("failed", False, "failed"),
    ],
)
def test_a_delivery_reads_as_one_of_four_states(status, retrying, state):
    assert delivery_state_of({"status": status, "retrying": retrying}) == state
