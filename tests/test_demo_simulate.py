"""`flask demo simulate [--brand ID]` (CONTRACT section 2, decisions "Demo"): each run moves the
demo workspace one step forward through the platform changes and prints
`{"brandId", "step", "events": [{"id", "type"}]}`; the events are the brand's new events, and
the read API shows the step. Errors are one line on stderr with a non-zero exit."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from sqlalchemy import func, select

from extensions import db
from fixtures.demo import seed_demo_workspace
from models import WebhookEvent
from models.columns import utcnow
from services.retention import delete_expired_deliveries, retention_period
from tests.helpers import assert_success


def seed(runner) -> str:
    result = runner.invoke(args=["demo", "seed"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["brandId"]


def simulate(runner, *args: str) -> dict:
    result = runner.invoke(args=["demo", "simulate", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert result.stdout.count("\n") == 1  # one JSON line, nothing else on stdout
    output = json.loads(result.stdout)
    assert set(output) == {"brandId", "step", "events"}
    assert isinstance(output["step"], str) and output["step"]
    return output


def stored_events(app, brand_id: str) -> dict[str, dict]:
    with app.app_context():
        rows = db.session.execute(
            select(WebhookEvent.id, WebhookEvent.body)
            .where(WebhookEvent.brand_id == brand_id)
            .order_by(WebhookEvent.id)
        ).all()
    return {row.id: json.loads(row.body) for row in rows}


class Reader:
    def __init__(self, client, brand_id: str, key: str) -> None:
        self.client, self.brand, self.key = client, brand_id, key

    def get(self, path: str) -> dict:
        response = self.client.get(
            f"/api/v1/brand/{self.brand}/{path}", headers={"X-Api-Key": self.key}
        )
        return assert_success(response)


@pytest.fixture
def demo(runner, client, make_key) -> Reader:
    brand_id = seed(runner)
    return Reader(client, brand_id, make_key(brand_id, scopes=("read",)))


def step(app, runner, demo: Reader) -> tuple[dict, dict[str, dict]]:
    """One simulate step: its output, and the events it printed, read back from the store."""
    before = stored_events(app, demo.brand)
    output = simulate(runner, "--brand", demo.brand)
    assert output["brandId"] == demo.brand
    after = stored_events(app, demo.brand)
    new = {event_id: body for event_id, body in after.items() if event_id not in before}
    # What it printed is exactly what it published, in order.
    assert [(e["id"], e["type"]) for e in output["events"]] == [
        (event_id, body["type"]) for event_id, body in new.items()
    ]
    return output, new


def types(output: dict) -> list[str]:
    return [event["type"] for event in output["events"]]


def data_of(events: dict[str, dict], name: str) -> list[dict]:
    return [body["data"] for body in events.values() if body["type"] == name]


def test_fresh_demo_moves_forward_step_by_step(app, runner, demo):
    # 1. The oldest unverified post of a running deal (@tobi.fits's) is verified and measured.
    first, events = step(app, runner, demo)
    assert types(first) == ["placement.verified", "placement.metrics_updated"]
    [verified] = data_of(events, "placement.verified")
    [measured] = data_of(events, "placement.metrics_updated")
    assert measured["id"] == verified["id"]
    assert measured["previousClicks"] == 0 and measured["clicks"] > 0
    tobi = demo.get(f"deals/{verified['dealId']}")
    assert tobi["creatorHandle"] == "@tobi.fits"
    assert tobi["settlement"]["verifiedPlacements"] == tobi["settlement"]["placementsRequired"]
    assert demo.get(f"placement/{verified['id']}")["verifiedAt"] is not None

    # 2. That deal, now fully verified, completes: its escrow is released, and the launch
    #    campaign's spend crosses half its budget.
    second, events = step(app, runner, demo)
    assert types(second) == [
        "escrow.released",
        "campaign.budget_threshold",
        "deal.completed",
        "deal.status_changed",
    ]
    [threshold] = data_of(events, "campaign.budget_threshold")
    assert threshold["thresholdPercent"] == 50
    assert threshold["name"] == "Harmattan Glow launch"
    assert threshold["spentMinor"] * 2 >= threshold["budgetMinor"]
    [completed] = data_of(events, "deal.completed")
    assert completed["id"] == tobi["id"]
    assert (completed["status"], completed["previousStatus"]) == ("completed", "in_progress")
    assert completed["escrow"]["releasedMinor"] == tobi["agreedAmountMinor"]
    assert demo.get(f"deals/{tobi['id']}")["status"] == "completed"
    [released] = data_of(events, "escrow.released")
    assert demo.get(f"escrow/{released['id']}")["status"] == "released"

    # 3-4. The next running deal (@zainab.glows) gets its second post verified, then completes;
    #      its release crosses no new threshold (50 percent was announced once already).
    third, events = step(app, runner, demo)
    assert types(third) == ["placement.verified", "placement.metrics_updated"]
    [verified] = data_of(events, "placement.verified")
    assert demo.get(f"deals/{verified['dealId']}")["creatorHandle"] == "@zainab.glows"
    fourth, _ = step(app, runner, demo)
    assert types(fourth) == ["escrow.released", "deal.completed", "deal.status_changed"]
    assert demo.get(f"deals/{verified['dealId']}")["status"] == "completed"


def test_simulate_keeps_moving_and_announces_each_threshold_once(app, runner, demo):
    crossed: list[tuple[str, int]] = []
    for _ in range(12):
        output, events = step(app, runner, demo)
        assert output["events"], output["step"]  # every step moves something
        crossed += [
            (data["name"], data["thresholdPercent"])
            for data in data_of(events, "campaign.budget_threshold")
        ]
    # The launch campaign's spend passes 50 then 80 percent (@chidi.daily's offer accepted,
    # posted, verified and completed); each is announced by the one release that crosses it.
    assert crossed == [("Harmattan Glow launch", 50), ("Harmattan Glow launch", 80)]


def test_simulate_without_brand_moves_the_demo_brand_not_a_later_seed(runner):
    first = seed(runner)
    seed(runner)
    assert simulate(runner)["brandId"] == first


def test_simulate_an_unknown_brand_is_a_one_line_error(runner):
    seed(runner)
    result = runner.invoke(args=["demo", "simulate", "--brand", "brd_nosuchbrand"])
    assert result.exit_code != 0
    assert result.stdout == ""
    assert result.stderr.strip().count("\n") == 0
    assert "brd_nosuchbrand" in result.stderr


def test_simulate_with_no_demo_brand_says_to_seed_one(app, runner, make_brand):
    other = make_brand("Acme Foods")  # a brand, but not the demo's
    result = runner.invoke(args=["demo", "simulate"])
    assert result.exit_code != 0
    assert result.stdout == ""
    assert result.stderr.strip().count("\n") == 0
    assert "demo seed" in result.stderr
    assert stored_events(app, other) == {}


def test_simulate_on_a_brand_with_no_data_exits_non_zero_and_says_so(app, runner, make_brand):
    empty = make_brand("Acme Foods")
    result = runner.invoke(args=["demo", "simulate", "--brand", empty])
    assert result.exit_code == 1
    assert result.stdout == ""
    error = result.stderr.strip()
    assert error.count("\n") == 0
    assert f"Brand {empty} has nothing to move" in error and "demo seed" in error
    assert stored_events(app, empty) == {}


def test_the_first_demo_brand_has_the_readmes_link_code_and_later_ones_their_own(
    runner, client, make_key
):
    first = json.loads(runner.invoke(args=["demo", "seed"]).stdout)
    second = json.loads(runner.invoke(args=["demo", "seed"]).stdout)
    assert first["linkCode"] == "GLOW-TOBI"
    assert second["linkCode"] == f"GLOW-TOBI-{second['brandId'][-4:].upper()}"
    for seeded in (first, second):
        reader = Reader(client, seeded["brandId"], make_key(seeded["brandId"]))
        [link] = reader.get(f"tracked-link/fetch-links?code={seeded['linkCode']}")["links"]
        deal = reader.get(f"deals/{link['dealId']}")
        assert (deal["creatorHandle"], deal["status"]) == ("@tobi.fits", "in_progress")


def test_demo_seed_leaves_the_demo_brand_as_it_was_and_names_the_new_one_apart(runner, make_brand):
    """The README captures `BRAND=$(flask demo brand)` after `make run`, and may run `demo
    seed` on the way: the brand it means, with its keys and plain codes, stays the one."""
    assert runner.invoke(args=["demo", "brand"]).exit_code == 1  # none yet
    first = seed(runner)
    before = runner.invoke(args=["demo", "brand"])
    assert (before.exit_code, before.stdout) == (0, first + "\n")
    assert "Kola Naturals (demo); link code GLOW-TOBI for" in before.stderr

    second, third = seed(runner), seed(runner)
    make_brand("Acme Foods")  # newer, but not a demo brand
    after = runner.invoke(args=["demo", "brand"])
    assert (after.exit_code, after.stdout, after.stderr) == (0, before.stdout, before.stderr)

    listing = runner.invoke(args=["brands", "list"]).stdout
    names = {
        brand_id: line.split("  ")[1].strip()
        for line in listing.splitlines()[1:]
        for brand_id in [line.split()[0]]
    }
    assert [names[first], names[second], names[third]] == [
        "Kola Naturals (demo)",
        "Kola Naturals (demo 2)",
        "Kola Naturals (demo 3)",
    ]


def demo_events(app, brand_id: str) -> tuple[int, object]:
    """How many events the brand has, and when its oldest was published."""
    with app.app_context():
        count, oldest = db.session.execute(
            select(func.count(), func.min(WebhookEvent.created_at)).where(
                WebhookEvent.brand_id == brand_id
            )
        ).one()
        db.session.remove()
    return count, oldest


def test_a_worker_s_first_purge_deletes_none_of_the_seeded_demo_history(app, runner):
    """`make run` seeds the demo, then its worker purges what is older than the retention at
    once: none of the demo's month may be that old (it was 2 events), whatever the time."""
    brand_id = seed(runner)
    seeded, _ = demo_events(app, brand_id)
    with app.app_context(), db.engine.connect() as connection:
        delete_expired_deliveries(connection, now=utcnow(), retention=retention_period())
    assert demo_events(app, brand_id)[0] == seeded

    # Seeded at any time of day (the story starts at 09:00 of its first day): a day's margin.
    yesterday = utcnow() - timedelta(days=1)
    for hour, minute in ((0, 1), (8, 59), (9, 1), (23, 59)):
        now = yesterday.replace(hour=hour, minute=minute)
        with app.app_context():
            seeded_brand = seed_demo_workspace(now=now).brand.id
            db.session.commit()
            retention = retention_period()
        _, oldest = demo_events(app, seeded_brand)
        assert oldest > now - retention + timedelta(hours=6), (now, oldest)
