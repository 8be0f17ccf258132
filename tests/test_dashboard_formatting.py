"""How the dashboard writes times and long tokens (blueprints/dashboard/formatting.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from blueprints.dashboard.formatting import breakable, relative_time

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
