"""An endpoint's `ordering` and `campaignIds` (CONTRACT 12.2, 12.3) and retry-pending (12.4), as a
brand sees them: through the API, and at a real receiver served by a real `flask worker`."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest

from extensions import db
from models.event_catalog import EVENT_NAMES
from services.delivery.queue import claim_attempts
from services.platform_changes import tracked_links
from services.platform_changes.campaigns import cancel_campaign, complete_campaign
from services.platform_changes.deals import complete_deal, dispute_deal, resolve_dispute
from services.platform_changes.workspace import complete_kyb_verification
from tests.helpers import assert_error, assert_success
from tests.receiver import Received, Receiver, Reply
from tests.test_platform_changes import Platform
from tests.test_webhook_delivery import Api, no_more_requests, poll, publish
from tests.worker_process import WorkerProcess, workers_started_by_test

HOOK_URL = "https://hooks.brand-example.invalid/x"


@pytest.fixture
def api(client, brand, write_key) -> Api:
    return Api(client, brand, write_key)


@pytest.fixture
def start_worker(app_environ) -> Iterator[Callable[..., WorkerProcess]]:
    """Real workers with the test's settings, stopped after it."""
    with workers_started_by_test(app_environ) as start:
        yield start


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


def register(api: Api, status: int = 201, **body) -> dict:
    return api.call("POST", "webhook/register-endpoint", status, json={"url": HOOK_URL, **body})


def update(api: Api, endpoint_id: str, **body):
    return api.client.patch(
        f"/api/v1/brand/{api.brand}/webhook/{endpoint_id}/update-endpoint",
        json=body,
        headers={"X-Api-Key": api.key},
    )


def listed(api: Api, endpoint_id: str) -> dict:
    return api.endpoint(endpoint_id)


# ---------------------------------------------------------------------------------------------
# The fields, in every shape


def test_ordering_and_campaigns_round_trip_in_every_endpoint_shape(app, api, brand):
    platform = Platform(app, brand)
    first, second = platform.campaign(), platform.campaign()

    default = register(api)
    assert (default["ordering"], default["campaignIds"]) == ("none", [])
    assert (listed(api, default["id"])["ordering"], listed(api, default["id"])["campaignIds"]) == (
        "none",
        [],
    )

    made = register(api, ordering="subject", campaignIds=[second, first, second])
    assert made["ordering"] == "subject"
    assert made["campaignIds"] == [second, first]  # each once, in the order given
    shown = listed(api, made["id"])
    assert (shown["ordering"], shown["campaignIds"]) == ("subject", [second, first])

    changed = assert_success(update(api, made["id"], ordering="none", campaignIds=[first]))
    assert (changed["ordering"], changed["campaignIds"]) == ("none", [first])
    shown = listed(api, made["id"])
    assert (shown["ordering"], shown["campaignIds"]) == ("none", [first])

    # Other changes leave them be; `[]` and `null` both mean every campaign again.
    assert assert_success(update(api, made["id"], description="kept"))["campaignIds"] == [first]
    assert assert_success(update(api, made["id"], campaignIds=[]))["campaignIds"] == []
    assert_success(update(api, made["id"], campaignIds=[first], ordering="subject"))
    cleared = assert_success(update(api, made["id"], campaignIds=None))
    assert (cleared["ordering"], cleared["campaignIds"]) == ("subject", [])


def test_a_campaign_that_is_not_the_brands_is_refused_by_name_and_changes_nothing(
    app, api, brand, make_brand
):
    ours = Platform(app, brand).campaign()
    theirs = Platform(app, make_brand("Other Foods")).campaign()
    made_up = "cmp_01jd3k9x2y4z6a8b0c2d4e6f8g"

    for ids in ([ours, theirs], [made_up], [theirs, made_up]):
        response = api.client.post(
            f"/api/v1/brand/{brand}/webhook/register-endpoint",
            json={"url": HOOK_URL, "campaignIds": ids},
            headers={"X-Api-Key": api.key},
        )
        body = assert_error(response, 400, "VALIDATION_ERROR")
        [message] = body["errors"]["campaignIds"]
        for foreign in set(ids) - {ours}:
            assert foreign in message
        assert ours not in message
    assert api.call("GET", "webhook/fetch-endpoints")["endpoints"] == []

    endpoint = register(api, campaignIds=[ours])
    refused = update(api, endpoint["id"], campaignIds=[theirs], ordering="subject")
    assert theirs in assert_error(refused, 400, "VALIDATION_ERROR")["errors"]["campaignIds"][0]
    shown = listed(api, endpoint["id"])
    assert (shown["campaignIds"], shown["ordering"]) == ([ours], "none")


def test_at_most_100_campaigns_and_only_known_orderings(app, api, brand):
    hundred_and_one = [f"cmp_{number:026d}" for number in range(101)]
    body = assert_error(
        api.client.post(
            f"/api/v1/brand/{brand}/webhook/register-endpoint",
            json={"url": HOOK_URL, "campaignIds": hundred_and_one},
            headers={"X-Api-Key": api.key},
        ),
        400,
        "VALIDATION_ERROR",
    )
    assert set(body["errors"]) == {"campaignIds"}
    for bad in ({"ordering": "fifo"}, {"ordering": None}, {"campaignIds": ["deal_1"]}):
        response = api.client.post(
            f"/api/v1/brand/{brand}/webhook/register-endpoint",
            json={"url": HOOK_URL, **bad},
            headers={"X-Api-Key": api.key},
        )
        errors = assert_error(response, 400, "VALIDATION_ERROR")["errors"]
        assert {key.split(".")[0] for key in errors} == set(bad), bad
    assert api.call("GET", "webhook/fetch-endpoints")["endpoints"] == []


def test_the_document_states_the_new_fields_and_the_route(client):
    spec = client.get("/api/v1/openapi.json").get_json()
    schemas = spec["components"]["schemas"]
    register = spec["paths"]["/brand/{brandId}/webhook/register-endpoint"]["post"]
    body = schemas[register["requestBody"]["content"]["application/json"]["schema"]["$ref"][21:]]
    assert body["properties"]["ordering"]["enum"] == ["none", "subject"]
    assert body["properties"]["ordering"]["default"] == "none"
    assert body["properties"]["campaignIds"]["maxItems"] == 100
    assert body["properties"]["campaignIds"]["items"]["pattern"].startswith("^cmp_")
    for shape in ("IssuedEndpoint", "ListedEndpoint", "UpdatedEndpoint"):
        assert {"ordering", "campaignIds"} <= set(schemas[shape]["properties"]), shape
    retry = spec["paths"]["/brand/{brandId}/webhook/{endpointId}/retry-pending"]["post"]
    assert retry["x-required-scope"] == "write"
    assert {"202", "403", "404"} <= set(retry["responses"])


# ---------------------------------------------------------------------------------------------
# A campaign filter, at a real receiver


def test_a_campaign_filter_delivers_only_that_campaigns_events_and_webhook_ones(
    app, api, brand, start_worker
):
    platform = Platform(app, brand)
    kept, other = platform.campaign(), platform.campaign()
    for campaign_id, code in ((kept, "KEPT25"), (other, "OTHER25")):
        platform.do(
            tracked_links.create_tracked_link,
            campaign_id=campaign_id,
            code=code,
            short_url=f"https://kola.link/{code}",
            destination_url="https://kolanaturals.example/glow",
        )
    watched, everything = Receiver(), Receiver()
    try:
        filtered = register_at(api, watched.url, campaign_ids=[kept])
        unfiltered = register_at(api, everything.url, campaign_ids=[])
        start_worker()
        before = {event["id"] for event in platform.events()}

        # The brand's KYB check (no campaign), then the same life in each campaign: a deal
        # completed, a deal disputed and settled, conversions through the campaign's link.
        platform.do(complete_kyb_verification, brand, kyb_status="verified")
        for campaign_id, code in ((kept, "KEPT25"), (other, "OTHER25")):
            completed = platform.accepted(campaign_id, 60_000)
            platform.verified(completed, clicks=10)
            platform.do(complete_deal, completed)
            disputed = platform.accepted(campaign_id, 1_001)
            platform.submit(disputed)
            platform.do(dispute_deal, disputed)
            platform.do(resolve_dispute, disputed, outcome="split")
            postback(api, f"order-20931-{code}", {"eventType": "purchase", "linkCode": code})
        postback(api, "order-20932-unattributed", {"eventType": "signup", "clickId": "clk_1"})
        platform.do(complete_campaign, kept)
        platform.do(cancel_campaign, other)
        # webhook.* events pass every filter: the test ping arrives.
        api.send_test(filtered["id"])

        events = [event for event in platform.events() if event["id"] not in before]
        of_kept = {event["id"] for event in events if campaign_of(event) == kept}
        families = {e["type"].split(".")[0] for e in events if e["id"] in of_kept}
        assert families >= {"campaign", "deal", "escrow", "placement", "dispute", "conversion"}
        watched.wait_for(len(of_kept) + 1, timeout=60)
        not_webhook = {event["id"] for event in events if not event["type"].startswith("webhook")}
        poll(
            lambda: {request.json["id"] for request in everything.received},
            lambda got: got >= not_webhook,
            timeout=60,
            what="the unfiltered endpoint getting every event",
        )
        no_more_requests(watched, len(of_kept) + 1, within=2.0)

        got = [request.json for request in watched.received]
        assert {body["id"] for body in got if body["type"] != "webhook.test"} == of_kept
        assert [body["type"] for body in got].count("webhook.test") == 1
        assert unfiltered["campaignIds"] == [] and filtered["campaignIds"] == [kept]
        # What it did not get: the other campaign's, the brand's own, the unattributed one's.
        missed = {event["type"] for event in events if event["id"] not in of_kept}
        assert {"verification.completed", "campaign.cancelled", "conversion.recorded"} <= missed
    finally:
        watched.close()
        everything.close()


def postback(api: Api, key: str, body: dict) -> None:
    response = api.client.post(
        f"/api/v1/brand/{api.brand}/conversion/record-postback",
        json={"valueMinor": 1250, "currency": "NGN", **body},
        headers={"X-Api-Key": api.key, "Idempotency-Key": key},
    )
    assert_success(response, 201)


def register_at(api: Api, url: str, *, campaign_ids: list[str]) -> dict:
    return api.call(
        "POST",
        "webhook/register-endpoint",
        201,
        json={"url": url, "events": list(EVENT_NAMES), "campaignIds": campaign_ids},
    )


def campaign_of(body: dict) -> str | None:
    """The campaign an event belongs to, read from its body as a receiver would."""
    if body["type"].startswith("campaign."):
        return body["data"]["id"]
    return body["data"].get("campaignId")


# ---------------------------------------------------------------------------------------------
# Retry now


def test_retry_pending_sends_a_delivery_waiting_an_hour_within_seconds(
    app, api, brand, receiver, start_worker, read_key
):
    receiver.reply_with(Reply(status=500))
    endpoint = api.register(receiver.url, ["deal.completed"])
    worker = start_worker(WEBHOOK_RETRY_SCHEDULE="3600")
    [(_, [delivery_id])] = publish(app, brand, ("deal.completed", {"id": "deal_1"}))
    # A worker starting on a busy machine may take a while to make the first attempt.
    waiting = api.wait_delivery(
        delivery_id, lambda d: d["attemptCount"] == 1, timeout=60, worker=worker
    )
    assert waiting["status"] == "pending" and waiting["retrying"] is True
    assert waiting["nextRetryAt"] > waiting["createdAt"]

    read_only = api.client.post(
        f"/api/v1/brand/{brand}/webhook/{endpoint['id']}/retry-pending",
        headers={"X-Api-Key": read_key},
    )
    assert_error(read_only, 403, "FORBIDDEN")
    assert api.delivery(delivery_id)["attemptCount"] == 1

    answer = api.call("POST", f"webhook/{endpoint['id']}/retry-pending", 202)
    assert answer == {"endpointId": endpoint["id"], "due": 1}
    # Due now, not in an hour: the worker sends it as soon as it looks (a bounded wait that an
    # hour's schedule could never meet).
    delivered = api.wait_delivery(delivery_id, "delivered", timeout=30, worker=worker)
    assert delivered["attemptCount"] == 2
    assert [r.delivery_id for r in receiver.received] == [delivery_id, delivery_id]
    # Nothing waits any more.
    assert api.call("POST", f"webhook/{endpoint['id']}/retry-pending", 202)["due"] == 0


def test_retry_pending_of_a_disabled_or_deleted_endpoint_is_not_found(api, brand):
    disabled = register(api)
    assert_success(update(api, disabled["id"], isActive=False))
    deleted = register(api)
    api.call("DELETE", f"webhook/{deleted['id']}/delete-endpoint")
    for endpoint in (disabled, deleted):
        response = api.client.post(
            f"/api/v1/brand/{brand}/webhook/{endpoint['id']}/retry-pending",
            headers={"X-Api-Key": api.key},
        )
        assert_error(response, 404, "NOT_FOUND")


# ---------------------------------------------------------------------------------------------
# Ordering per subject, at a real receiver


class FailsOneSubjectFirst(Receiver):
    """Fails the first event of deal `held` three times (500), the third time only once every
    event of deal `flowing` has arrived (so those demonstrably pass while it is pending), then
    takes it; takes everything else at once."""

    def __init__(self, held: str, flowing: str, flowing_count: int) -> None:
        super().__init__()
        self.held, self.flowing, self.flowing_count = held, flowing, flowing_count
        self.first_event_attempts = 0
        self.flowing_arrived = threading.Event()
        self.flowing_all_in_before_success = False

    def _record(self, request: Received) -> Reply:
        reply = super()._record(request)
        body = request.json
        subject = body["subject"]["id"]
        if subject == self.flowing:
            if sum(r.json["subject"]["id"] == self.flowing for r in self.received) >= (
                self.flowing_count
            ):
                self.flowing_arrived.set()
            return reply
        if subject != self.held or body["sequence"] != 1:
            return reply
        self.first_event_attempts += 1
        if self.first_event_attempts < 3:
            return Reply(status=500)
        if self.first_event_attempts == 3:
            self.flowing_arrived.wait(20)
            self.flowing_all_in_before_success = self.flowing_arrived.is_set()
            return Reply(status=500)
        return reply


def test_ordering_by_subject_holds_a_subjects_next_events_until_its_first_succeeds(
    app, api, brand, start_worker
):
    life = ("deal.accepted", "escrow.held", "placement.verified", "deal.completed")
    receiver = FailsOneSubjectFirst("deal_held", "deal_flowing", flowing_count=len(life))
    try:
        endpoint = api.call(
            "POST",
            "webhook/register-endpoint",
            201,
            json={"url": receiver.url, "events": list(life), "ordering": "subject"},
        )
        worker = start_worker(WEBHOOK_RETRY_SCHEDULE="1,1,1,1", WEBHOOK_TIMEOUT="30")

        def events_of(deal_id: str) -> list[tuple[str, dict]]:
            return [
                (name, {"id": deal_id} if name.startswith("deal.") else {"dealId": deal_id})
                for name in life
            ]

        # The held deal's whole life at once, then the other deal's.
        held = publish(app, brand, *events_of("deal_held"))
        publish(app, brand, *events_of("deal_flowing"))
        for _, [delivery_id] in held:
            api.wait_delivery(delivery_id, "delivered", timeout=60, worker=worker)

        arrived = [(r.json["subject"]["id"], r.json["sequence"]) for r in receiver.received]
        of_held = [sequence for subject, sequence in arrived if subject == "deal_held"]
        of_flowing = [sequence for subject, sequence in arrived if subject == "deal_flowing"]
        # Nothing later of the held deal before its first event went through, on its 4th try.
        assert of_held == [1, 1, 1, 1, 2, 3, 4], arrived
        assert of_flowing == [1, 2, 3, 4], arrived
        # The other deal's events all arrived while the first one was failing.
        assert receiver.flowing_all_in_before_success, arrived
        assert endpoint["ordering"] == "subject"
    finally:
        receiver.close()


def test_the_deliveries_log_shows_the_subjects_events_in_their_sequence(app, api, brand):
    """The body every delivery sends carries the subject and its place in it."""
    endpoint = api.register(HOOK_URL, ["deal.accepted", "deal.completed"])
    published = publish(
        app,
        brand,
        ("deal.accepted", {"id": "deal_seq"}),
        ("deal.completed", {"id": "deal_seq"}),
    )
    payloads = [api.delivery(delivery)["payload"] for _, [delivery] in published]
    assert [p["subject"] for p in payloads] == [{"type": "deal", "id": "deal_seq"}] * 2
    assert [p["sequence"] for p in payloads] == [1, 2]
    assert endpoint["ordering"] == "none"
    assert json.dumps(payloads[0])  # plain JSON, as sent


def test_a_held_delivery_says_what_it_waits_behind_and_nothing_else_does(app, api, brand):
    """CONTRACT 13.1: a delivery an ordered endpoint holds carries `heldBehind`, the pending
    delivery of its subject it waits for; every other delivery carries null. Its status stays
    `pending`, its attempt count 0 and its next retry null: only `heldBehind` tells it apart
    from one waiting for its first attempt."""
    api.register(HOOK_URL, ["deal.accepted", "deal.completed"], ordering="subject")
    [(_, [first]), (_, [second])] = publish(
        app, brand, ("deal.accepted", {"id": "deal_h"}), ("deal.completed", {"id": "deal_h"})
    )
    [(_, [other])] = publish(app, brand, ("deal.accepted", {"id": "deal_other"}))
    with app.app_context():
        claimed = claim_attempts(
            slots=10, endpoint_limit=5, token="0000aaaa", lease=timedelta(seconds=30)
        )
        db.session.commit()
    assert {a.delivery_id for a in claimed.attempts} == {first, other}
    held = api.delivery(second)
    assert held["heldBehind"] == first
    assert (held["status"], held["attemptCount"], held["nextRetryAt"]) == ("pending", 0, None)
    assert api.delivery(first)["heldBehind"] is None
    deliveries, _ = api.deliveries()
    assert {d["id"]: d["heldBehind"] for d in deliveries} == {
        first: None,
        second: first,
        other: None,
    }
