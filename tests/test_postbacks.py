"""Conversion postbacks through the API (SPEC sections 2 and 4, CONTRACT section 5): recording,
replay, attribution and the link's counters, validation, credentials, the event, and reading
conversions back. Concurrency and crashes against a real server: test_postback_concurrency.py."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select

from extensions import db
from models import Conversion, TrackedLinkConversionCount, WebhookDelivery, WebhookEvent
from models.event_catalog import sample_data
from models.tracked_link import CONVERSION_COUNT_SLOTS
from schemas.conversions import ConversionSchema
from tests.helpers import EVENT_ENVELOPE_KEYS, assert_error, assert_success
from tests.platform_factory import PlatformFactory

AT = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
HOOK_URL = "https://hooks.brand-example.invalid/conversions"
CONVERSION_FIELDS = {
    "id",
    "idempotencyKey",
    "eventType",
    "clickId",
    "linkCode",
    "linkId",
    "campaignId",
    "dealId",
    "valueMinor",
    "currency",
    "metadata",
    "attributed",
    "createdAt",
}


def route(brand_id: str, tail: str = "record-postback") -> str:
    return f"/api/v1/brand/{brand_id}/conversion/{tail}"


def post(client, brand_id: str, key: str, body, idempotency_key: str | None = "order-1-purchase"):
    headers = {"X-Api-Key": key}
    if idempotency_key is not None:
        headers["Idempotency-Key"] = idempotency_key
    if isinstance(body, dict | list):
        return client.post(route(brand_id), json=body, headers=headers)
    return client.post(route(brand_id), data=body, headers=headers, content_type="application/json")


def counts(app) -> tuple[int, int, int]:
    """(conversions, conversion.recorded events, their deliveries) in the whole database."""
    with app.app_context():
        return (
            db.session.scalar(select(func.count()).select_from(Conversion)),
            db.session.scalar(
                select(func.count())
                .select_from(WebhookEvent)
                .where(WebhookEvent.name == "conversion.recorded")
            ),
            db.session.scalar(
                select(func.count())
                .select_from(WebhookDelivery)
                .where(WebhookDelivery.event_name == "conversion.recorded")
            ),
        )


def recorded_events(app, brand_id: str) -> list[dict]:
    with app.app_context():
        bodies = db.session.scalars(
            select(WebhookEvent.body)
            .where(WebhookEvent.brand_id == brand_id, WebhookEvent.name == "conversion.recorded")
            .order_by(WebhookEvent.id)
        )
        return [json.loads(body) for body in bodies]


class Shop:
    """A brand with a campaign, a deal, a deal link `GLOW25` and a campaign-wide link `KOLA`
    (both NGN), a key of each scope, and a webhook endpoint on the default subscription."""

    def __init__(
        self, app, client, make_key, name: str = "Kola Naturals", suffix: str = ""
    ) -> None:
        self.app, self.client = app, client
        factory = PlatformFactory(app)
        self.brand = factory.brand(name, at=AT)
        self.campaign = factory.campaign(self.brand, at=AT, published_at=AT)
        self.deal = factory.deal(self.campaign, at=AT, accepted_at=AT)
        self.deal_link = factory.link(self.campaign, "GLOW25" + suffix, at=AT, deal_id=self.deal)
        self.campaign_link = factory.link(self.campaign, "KOLA" + suffix, at=AT)
        self.read_key = make_key(self.brand, scopes=("read",))
        self.write_key = make_key(self.brand, scopes=("read", "write"))
        registered = client.post(
            f"/api/v1/brand/{self.brand}/webhook/register-endpoint",
            json={"url": HOOK_URL},
            headers={"X-Api-Key": self.write_key},
        )
        self.endpoint = assert_success(registered, 201)["id"]

    def post(self, body, idempotency_key: str | None = "order-1-purchase", key: str | None = None):
        return post(self.client, self.brand, key or self.read_key, body, idempotency_key)

    def link(self, link_id: str) -> dict:
        response = self.client.get(
            f"/api/v1/brand/{self.brand}/tracked-link/{link_id}",
            headers={"X-Api-Key": self.read_key},
        )
        return assert_success(response)

    def links(self) -> list[dict]:
        response = self.client.get(
            f"/api/v1/brand/{self.brand}/tracked-link/fetch-links",
            headers={"X-Api-Key": self.read_key},
        )
        return assert_success(response)["links"]

    def conversion(self, conversion_id: str) -> dict:
        response = self.client.get(
            route(self.brand, conversion_id), headers={"X-Api-Key": self.read_key}
        )
        return assert_success(response)

    def list(self, **query) -> tuple[list[dict], dict]:
        response = self.client.get(
            route(self.brand, "fetch-postbacks"),
            query_string=query,
            headers={"X-Api-Key": self.read_key},
        )
        body = response.get_json()
        return assert_success(response)["conversions"], body["meta"]


@pytest.fixture
def shop(app, client, make_key) -> Shop:
    return Shop(app, client, make_key)


PURCHASE = {
    "eventType": "purchase",
    "linkCode": "GLOW25",
    "clickId": "clk_8f2a61",
    "valueMinor": 1_250_000,
    "currency": "NGN",
    "metadata": {"orderId": "ORD-20931", "items": [{"sku": "SHEA-200", "qty": 2}]},
}


# ---------------------------------------------------------------------------------------------
# Recording and replay


def test_a_new_postback_is_recorded_attributed_and_counted_on_its_link(app, shop):
    data = assert_success(shop.post(PURCHASE), 201)

    assert data == {
        "conversionId": data["conversionId"],
        "replay": False,
        "attributed": True,
        "linkId": shop.deal_link,
        "campaignId": shop.campaign,
        "dealId": shop.deal,
    }
    assert data["conversionId"].startswith("conv_")
    link = shop.link(shop.deal_link)
    assert (link["conversions"], link["conversionValueMinor"]) == (1, 1_250_000)
    stored = shop.conversion(data["conversionId"])
    assert set(stored) == CONVERSION_FIELDS
    assert stored | {"createdAt": None} == {
        "id": data["conversionId"],
        "idempotencyKey": "order-1-purchase",
        "eventType": "purchase",
        "clickId": "clk_8f2a61",
        "linkCode": "GLOW25",
        "linkId": shop.deal_link,
        "campaignId": shop.campaign,
        "dealId": shop.deal,
        "valueMinor": 1_250_000,
        "currency": "NGN",
        "metadata": PURCHASE["metadata"],
        "attributed": True,
        "createdAt": None,
    }
    assert counts(app) == (1, 1, 1)


def test_a_links_counters_add_up_every_slot_its_postbacks_counted_in(app, shop):
    shop.post(PURCHASE)
    with app.app_context():
        (taken,) = db.session.scalars(
            select(TrackedLinkConversionCount.slot).where(
                TrackedLinkConversionCount.link_id == shop.deal_link
            )
        ).all()
        # What a postback on another database connection, counting in its own slot, leaves.
        db.session.add(
            TrackedLinkConversionCount(
                link_id=shop.deal_link,
                slot=(taken + 1) % CONVERSION_COUNT_SLOTS,
                conversions=2,
                conversion_value_minor=300,
            )
        )
        db.session.commit()

    link = shop.link(shop.deal_link)
    assert (link["conversions"], link["conversionValueMinor"]) == (3, 1_250_300)
    listed = {row["id"]: row for row in shop.links()}
    assert (listed[shop.deal_link]["conversions"], listed[shop.campaign_link]["conversions"]) == (
        3,
        0,
    )


def test_the_response_status_and_message_tell_a_new_conversion_from_a_replay(shop):
    first = shop.post(PURCHASE)
    again = shop.post(PURCHASE)

    assert (first.status_code, first.get_json()["message"]) == (201, "Conversion recorded")
    assert again.status_code == 200
    assert "Replay" in again.get_json()["message"]


def test_a_repeated_key_replays_the_first_conversion_whatever_the_new_body(app, shop):
    first = assert_success(shop.post(PURCHASE), 201)

    different = {"eventType": "refund", "linkCode": "KOLA", "valueMinor": 5, "currency": "USD"}
    replay = assert_success(shop.post(different), 200)

    assert replay == first | {"replay": True}
    link = shop.link(shop.deal_link)
    assert (link["conversions"], link["conversionValueMinor"]) == (1, 1_250_000)
    assert shop.link(shop.campaign_link)["conversions"] == 0
    assert shop.conversion(first["conversionId"])["eventType"] == "purchase"
    assert counts(app) == (1, 1, 1)  # a replay publishes nothing


def test_a_replay_never_expires(app, shop):
    first = assert_success(shop.post(PURCHASE), 201)
    with app.app_context():
        db.session.execute(
            Conversion.__table__.update().values(created_at=AT - timedelta(days=400))
        )
        db.session.commit()

    assert assert_success(shop.post(PURCHASE), 200)["conversionId"] == first["conversionId"]


def test_a_replay_may_use_another_key_of_the_brand(shop):
    first = assert_success(shop.post(PURCHASE, key=shop.read_key), 201)
    replay = assert_success(shop.post(PURCHASE, key=shop.write_key), 200)

    assert replay["conversionId"] == first["conversionId"]


def test_idempotency_keys_belong_to_one_brand(app, client, make_key, shop):
    other = Shop(app, client, make_key, name="Other Brand", suffix="o")

    mine = assert_success(shop.post(PURCHASE), 201)
    theirs = assert_success(other.post(PURCHASE | {"linkCode": "GLOW25o"}), 201)

    assert mine["conversionId"] != theirs["conversionId"]
    assert theirs["campaignId"] == other.campaign
    assert counts(app) == (2, 2, 2)


def test_keys_are_case_sensitive_and_distinct_keys_are_distinct_conversions(shop):
    first = assert_success(shop.post(PURCHASE, idempotency_key="order-1-purchase"), 201)
    second = assert_success(shop.post(PURCHASE, idempotency_key="ORDER-1-PURCHASE"), 201)

    assert first["conversionId"] != second["conversionId"]
    link = shop.link(shop.deal_link)
    assert (link["conversions"], link["conversionValueMinor"]) == (2, 2_500_000)


def test_read_and_write_keys_may_both_record(shop):
    assert_success(shop.post(PURCHASE, idempotency_key="by-read-key-0001", key=shop.read_key), 201)
    assert_success(
        shop.post(PURCHASE, idempotency_key="by-write-key-0001", key=shop.write_key), 201
    )


def test_many_postbacks_from_one_address_are_never_throttled(shop):
    statuses = {
        shop.post({"eventType": "click"}, idempotency_key=f"burst-{n:012d}").status_code
        for n in range(60)
    }
    assert statuses == {201}


# ---------------------------------------------------------------------------------------------
# Attribution (SPEC 2 rules 1-3 as CONTRACT 5 reads them)


def test_a_campaign_wide_link_gives_the_campaign_and_no_deal(shop):
    data = assert_success(shop.post({"eventType": "signup", "linkCode": "KOLA"}), 201)

    assert (data["attributed"], data["linkId"], data["campaignId"], data["dealId"]) == (
        True,
        shop.campaign_link,
        shop.campaign,
        None,
    )
    assert shop.link(shop.campaign_link)["conversions"] == 1


def test_an_unknown_link_code_is_stored_attributed_but_on_no_link(shop):
    data = assert_success(shop.post({"eventType": "lead", "linkCode": "NOPE99"}), 201)

    # SPEC's rule 2 calls it attributed; linkId tells the client the code matched nothing.
    assert (data["attributed"], data["linkId"]) == (True, None)
    assert (data["campaignId"], data["dealId"]) == (None, None)
    replay = assert_success(shop.post({"eventType": "lead", "linkCode": "NOPE99"}), 200)
    assert (replay["replay"], replay["attributed"], replay["linkId"]) == (True, True, None)
    stored = shop.conversion(data["conversionId"])
    assert (stored["linkCode"], stored["linkId"]) == ("NOPE99", None)
    assert shop.link(shop.deal_link)["conversions"] == 0


def test_another_brands_link_code_is_not_attributed_and_their_link_is_untouched(
    app, client, make_key, shop
):
    other = Shop(app, client, make_key, name="Other Brand", suffix="o")

    data = assert_success(shop.post({"eventType": "lead", "linkCode": "GLOW25o"}), 201)

    assert (data["linkId"], data["campaignId"], data["dealId"]) == (None, None, None)
    assert data["attributed"] is True  # rule 2: a code was present
    assert other.link(other.deal_link)["conversions"] == 0


def test_a_click_id_alone_attributes_without_a_link(shop):
    data = assert_success(shop.post({"eventType": "lead", "clickId": "clk_1"}), 201)

    assert (data["attributed"], data["linkId"], data["campaignId"]) == (True, None, None)


def test_neither_code_nor_click_id_is_unattributed(shop):
    data = assert_success(shop.post({"eventType": "lead", "clickId": None}), 201)

    assert (data["attributed"], data["linkId"], data["campaignId"]) == (False, None, None)


def test_link_codes_match_exactly_after_trimming_spaces(shop):
    wrong_case = assert_success(
        shop.post({"eventType": "lead", "linkCode": "glow25"}, "k-lower-case-0001"), 201
    )
    padded = assert_success(
        shop.post({"eventType": "lead", "linkCode": " GLOW25 "}, "k-padded-code-0001"), 201
    )

    assert wrong_case["campaignId"] is None
    assert padded["dealId"] == shop.deal


def test_defaults_are_zero_value_in_naira_and_empty_metadata(shop):
    data = assert_success(shop.post({"eventType": "signup", "linkCode": "GLOW25"}), 201)

    stored = shop.conversion(data["conversionId"])
    assert (stored["valueMinor"], stored["currency"], stored["metadata"]) == (0, "NGN", {})
    assert (stored["clickId"], stored["linkCode"]) == (None, "GLOW25")
    assert shop.link(shop.deal_link)["conversions"] == 1


def test_a_conversion_in_another_currency_is_counted_but_its_value_is_not_added(shop):
    assert_success(shop.post(PURCHASE | {"valueMinor": 900}, "naira-order-00001"), 201)
    assert_success(
        shop.post(PURCHASE | {"valueMinor": 4_999, "currency": "USD"}, "dollar-order-0001"), 201
    )

    link = shop.link(shop.deal_link)
    assert (link["conversions"], link["conversionValueMinor"], link["currency"]) == (2, 900, "NGN")


# ---------------------------------------------------------------------------------------------
# Validation: a 400 naming each field, nothing stored


@pytest.mark.parametrize(
    ("idempotency_key", "problem"),
    [
        (None, "Missing data for required field."),
        ("", "16-128"),
        ("too-short-key", "16-128"),
        ("k" * 129, "16-128"),
        ("order 1 purchase with spaces", "16-128"),
        ("order/1/purchase/slashes", "16-128"),
        ("order-1-purchase-é-accent", "16-128"),
    ],
    ids=["missing", "empty", "15-chars", "129-chars", "spaces", "slashes", "non-ascii"],
)
def test_a_missing_or_malformed_idempotency_key_is_refused(app, shop, idempotency_key, problem):
    body = assert_error(
        shop.post(PURCHASE, idempotency_key=idempotency_key), 400, "VALIDATION_ERROR"
    )

    assert list(body["errors"]) == ["Idempotency-Key"]
    assert problem in body["errors"]["Idempotency-Key"][0]
    assert counts(app) == (0, 0, 0)


@pytest.mark.parametrize("length", [16, 128])
def test_idempotency_keys_of_the_bounds_lengths_with_every_allowed_character_are_taken(
    shop, length
):
    key = ("Az09-_:" * 20)[:length]
    assert_success(shop.post(PURCHASE, idempotency_key=key), 201)


def test_an_idempotency_key_that_is_a_credential_is_refused_without_echoing_it(app, shop):
    body = assert_error(shop.post(PURCHASE, idempotency_key=shop.read_key), 400, "VALIDATION_ERROR")

    assert "credential" in body["errors"]["Idempotency-Key"][0]
    assert shop.read_key not in json.dumps(body)
    assert counts(app) == (0, 0, 0)


INVALID_BODIES = [
    ({}, "eventType"),
    ({"eventType": ""}, "eventType"),
    ({"eventType": "   "}, "eventType"),
    ({"eventType": "x" * 101}, "eventType"),
    ({"eventType": 7}, "eventType"),
    ({"eventType": "buy\nnow"}, "eventType"),
    ({"eventType": None}, "eventType"),
    ({"eventType": "purchase", "valueMinor": -1}, "valueMinor"),
    ({"eventType": "purchase", "valueMinor": 12.5}, "valueMinor"),
    ({"eventType": "purchase", "valueMinor": "1250"}, "valueMinor"),
    ({"eventType": "purchase", "valueMinor": True}, "valueMinor"),
    ({"eventType": "purchase", "valueMinor": None}, "valueMinor"),
    ({"eventType": "purchase", "valueMinor": 10**15 + 1}, "valueMinor"),
    ({"eventType": "purchase", "currency": "EUR"}, "currency"),
    ({"eventType": "purchase", "currency": "ngn"}, "currency"),
    ({"eventType": "purchase", "currency": None}, "currency"),
    ({"eventType": "purchase", "metadata": ["ORD-1"]}, "metadata"),
    ({"eventType": "purchase", "metadata": "ORD-1"}, "metadata"),
    ({"eventType": "purchase", "metadata": 42}, "metadata"),
    ({"eventType": "purchase", "clickId": ""}, "clickId"),
    ({"eventType": "purchase", "clickId": 123}, "clickId"),
    ({"eventType": "purchase", "clickId": "c" * 256}, "clickId"),
    ({"eventType": "purchase", "linkCode": ""}, "linkCode"),
    ({"eventType": "purchase", "linkCode": "l" * 101}, "linkCode"),
    ({"eventType": "purchase", "linkCode": ["GLOW25"]}, "linkCode"),
    ({"eventType": "purchase", "value_minor": 100}, "value_minor"),
    ({"eventType": "purchase", "brandId": "brd_x"}, "brandId"),
]


@pytest.mark.parametrize(
    ("body", "field"), INVALID_BODIES, ids=[repr(b) for b, _ in INVALID_BODIES]
)
def test_an_invalid_field_is_refused_by_name_and_nothing_is_stored(app, shop, body, field):
    response = assert_error(shop.post(body), 400, "VALIDATION_ERROR")

    assert field in response["errors"], response["errors"]
    assert counts(app) == (0, 0, 0)
    assert shop.link(shop.deal_link)["conversions"] == 0
    # A refused request does not take the key: the corrected retry is recorded.
    assert_success(shop.post(PURCHASE), 201)


@pytest.mark.parametrize(
    "raw", ["", "not json", "[1, 2]", '"purchase"', "null", '{"eventType": "a\\u0000b"}']
)
def test_a_body_that_is_not_a_json_object_is_refused(app, shop, raw):
    response = assert_error(shop.post(raw), 400, "VALIDATION_ERROR")

    assert response["errors"]
    assert counts(app) == (0, 0, 0)


def test_every_invalid_part_is_reported_in_one_answer(shop):
    body = {"eventType": "", "valueMinor": -5, "currency": "GBP", "metadata": [], "extra": 1}
    response = assert_error(shop.post(body, idempotency_key="short"), 400, "VALIDATION_ERROR")

    assert set(response["errors"]) == {
        "Idempotency-Key",
        "eventType",
        "valueMinor",
        "currency",
        "metadata",
        "extra",
    }


def test_metadata_up_to_8_kib_is_kept_exactly_and_larger_is_refused(app, shop):
    # {"note":"…"} is 11 bytes of JSON around the text.
    at_limit = {"note": "x" * (8 * 1024 - 11)}
    over = {"note": "x" * (8 * 1024 - 10)}

    accepted = assert_success(
        shop.post(PURCHASE | {"metadata": at_limit}, "meta-at-limit-0001"), 201
    )
    refused = assert_error(
        shop.post(PURCHASE | {"metadata": over}, "meta-over-limit-001"), 400, "VALIDATION_ERROR"
    )

    assert shop.conversion(accepted["conversionId"])["metadata"] == at_limit
    assert "8,192 bytes" in refused["errors"]["metadata"][0]


def test_metadata_keeps_nesting_types_and_unicode(shop):
    metadata = {
        "order": {"id": "ORD-1", "lines": [{"sku": "A", "qty": 2, "price": 12.5}]},
        "gift": False,
        "coupon": None,
        "customer": "Ọlá Adébáyọ̀",
    }
    data = assert_success(shop.post(PURCHASE | {"metadata": metadata}), 201)

    assert shop.conversion(data["conversionId"])["metadata"] == metadata


def test_metadata_null_is_stored_as_empty(shop):
    data = assert_success(shop.post(PURCHASE | {"metadata": None}), 201)

    assert shop.conversion(data["conversionId"])["metadata"] == {}


def test_metadata_nested_too_deep_is_refused(app, shop):
    deep: dict = {"leaf": 1}
    for _ in range(9):
        deep = {"next": deep}

    response = assert_error(shop.post(PURCHASE | {"metadata": deep}), 400, "VALIDATION_ERROR")

    assert "deeper" in response["errors"]["metadata"][0]
    assert counts(app) == (0, 0, 0)


@pytest.mark.parametrize(
    "metadata",
    [
        {"apiKey": "SECRET"},
        {"nested": {"deeper": ["ok", "SECRET"]}},
        {"auth": "Bearer SECRET"},
        {"SECRET": "as a key"},
        {"token": "  SECRET"},
    ],
    ids=["value", "nested-in-list", "inside-text", "as-key", "padded"],
)
@pytest.mark.parametrize(
    "kind", ["api-key", "bootstrap-token", "signing-secret", "older-signing-secret"]
)
def test_metadata_carrying_a_credential_is_refused_without_echoing_it(
    app, shop, make_bootstrap_token, metadata, kind
):
    secret = {
        "api-key": shop.write_key,
        "bootstrap-token": make_bootstrap_token(shop.brand),
        # base64 since CONTRACT 12.1 (`+`, `/`, a final `=`); base62 before
        "signing-secret": "whsec_" + base64.b64encode(b"\xfb\xef" * 16).decode(),
        "older-signing-secret": "whsec_" + "A1b2C3d4" * 5,
    }[kind]
    if kind == "bootstrap-token" and "Bearer" in json.dumps(metadata):
        # `bst_` is refused only at the start of a text: it occurs inside ordinary words.
        metadata = {"auth": "SECRET"}
    body = PURCHASE | {"metadata": json.loads(json.dumps(metadata).replace("SECRET", secret))}

    response = assert_error(shop.post(body), 400, "VALIDATION_ERROR")

    assert "credential" in response["errors"]["metadata"][0]
    assert secret not in json.dumps(response)
    assert secret[:12] not in json.dumps(response)
    assert counts(app) == (0, 0, 0)


def test_metadata_words_that_merely_contain_bst_are_accepted(shop):
    metadata = {"note": "robust_substitute abst_value", "sku": "BST-100"}
    assert_success(shop.post(PURCHASE | {"metadata": metadata}), 201)


# ---------------------------------------------------------------------------------------------
# Credentials


def test_a_postback_needs_a_key_of_the_brand(app, client, make_key, shop):
    other = Shop(app, client, make_key, name="Other Brand", suffix="o")

    assert_error(post(client, shop.brand, "", PURCHASE), 401, "UNAUTHORIZED")
    assert_error(post(client, shop.brand, "svc_live_nonsense", PURCHASE), 401, "UNAUTHORIZED")
    forbidden = assert_error(post(client, shop.brand, other.read_key, PURCHASE), 403, "FORBIDDEN")
    assert forbidden["message"] == "API key does not belong to this brand"
    assert counts(app) == (0, 0, 0)


def test_a_bootstrap_token_cannot_record_a_postback(app, shop, make_bootstrap_token):
    token = make_bootstrap_token(shop.brand)
    response = shop.client.post(
        route(shop.brand),
        json=PURCHASE,
        headers={"X-Service-Bootstrap-Token": token, "Idempotency-Key": "order-1-purchase"},
    )
    assert_error(response, 401, "UNAUTHORIZED")
    assert counts(app) == (0, 0, 0)


def test_a_revoked_key_is_refused_at_once(app, shop):
    with app.app_context():
        from services.api_keys import list_active_keys, revoke_api_key

        [read] = [k for k in list_active_keys(shop.brand) if k.scopes == ["read"]]
        revoke_api_key(brand_id=shop.brand, key_id=read.id)
        db.session.commit()

    assert_error(shop.post(PURCHASE), 401, "UNAUTHORIZED")
    assert counts(app) == (0, 0, 0)


# ---------------------------------------------------------------------------------------------
# conversion.recorded


def test_a_new_conversion_publishes_its_stored_record_once(app, shop):
    data = assert_success(shop.post(PURCHASE), 201)
    shop.post(PURCHASE)  # a replay

    [event] = recorded_events(app, shop.brand)
    assert event["type"] == "conversion.recorded"
    assert event["brandId"] == shop.brand
    assert event["data"] == shop.conversion(data["conversionId"])
    with app.app_context():
        [delivery] = db.session.scalars(
            select(WebhookDelivery).where(WebhookDelivery.event_id == event["id"])
        ).all()
        assert (delivery.endpoint_id, delivery.status) == (shop.endpoint, "pending")


def test_every_event_body_is_written_as_publish_event_writes_one(app, shop):
    """Deliveries are signed and sent as stored. On PostgreSQL a postback's one statement writes
    the body around the link, campaign and deal it finds: whatever it finds, the body must be
    the compact JSON, keys in order, non-ASCII as is, that publish_event writes for any event."""
    postbacks = {
        "body-deal-link-0001": PURCHASE,
        "body-campaign-link1": {"eventType": "lead", "linkCode": "KOLA"},
        "body-unknown-code01": {
            "eventType": "purchase",
            "linkCode": "MYSTERY",
            "metadata": {"note": 'Ẹ k\u00e1 "quoted" \\ ✓', "linkId": None},
        },
        "body-no-link-00001": {"eventType": "signup", "clickId": "clk_01"},
    }
    recorded = {
        assert_success(shop.post(body, idempotency_key=key), 201)["conversionId"]
        for key, body in postbacks.items()
    }

    events = recorded_events(app, shop.brand)
    assert {event["data"]["id"] for event in events} == recorded
    with app.app_context():
        bodies = db.session.scalars(
            select(WebhookEvent.body).where(
                WebhookEvent.brand_id == shop.brand, WebhookEvent.name == "conversion.recorded"
            )
        ).all()
    data_keys = [field.data_key for field in ConversionSchema().fields.values()]
    assert len(bodies) == len(postbacks)
    for body in bodies:
        event = json.loads(body)
        assert body == json.dumps(event, separators=(",", ":"), ensure_ascii=False)
        assert list(event) == EVENT_ENVELOPE_KEYS
        assert list(event["data"]) == data_keys
        assert event["data"] == shop.conversion(event["data"]["id"])


def test_the_catalogue_sample_has_the_keys_of_the_real_event(app, shop):
    assert_success(shop.post(PURCHASE), 201)

    [event] = recorded_events(app, shop.brand)
    assert set(event["data"]) == set(sample_data("conversion.recorded"))


def test_endpoints_not_subscribed_to_conversions_get_no_delivery(app, shop):
    shop.client.post(
        f"/api/v1/brand/{shop.brand}/webhook/register-endpoint",
        json={"url": HOOK_URL + "/deals", "events": ["deal.completed"]},
        headers={"X-Api-Key": shop.write_key},
    )

    assert_success(shop.post(PURCHASE), 201)

    assert counts(app) == (1, 1, 1)


# ---------------------------------------------------------------------------------------------
# fetch-postbacks and fetch-conversion


def record(shop: Shop, key: str, **body) -> str:
    return assert_success(shop.post({"eventType": "purchase"} | body, idempotency_key=key), 201)[
        "conversionId"
    ]


@pytest.fixture
def history(shop) -> dict[str, str]:
    """Five conversions, oldest first: three on links, one unknown code, one plain signup."""
    return {
        "deal_purchase": record(shop, "hist-deal-purchase", linkCode="GLOW25", valueMinor=100),
        "campaign_purchase": record(shop, "hist-camp-purchase", linkCode="KOLA", valueMinor=200),
        "deal_lead": record(shop, "hist-deal-lead-0001", eventType="lead", linkCode="GLOW25"),
        "unknown_code": record(shop, "hist-unknown-code01", linkCode="MYSTERY"),
        "signup": record(shop, "hist-plain-signup01", eventType="signup"),
    }


def ids(conversions: list[dict]) -> list[str]:
    return [conversion["id"] for conversion in conversions]


def test_fetch_postbacks_lists_newest_first_with_every_field(shop, history):
    conversions, meta = shop.list()

    assert ids(conversions) == list(reversed(history.values()))
    assert all(set(conversion) == CONVERSION_FIELDS for conversion in conversions)
    assert meta == {
        "page": 1,
        "limit": 20,
        "total": 5,
        "totalPages": 1,
        "hasNext": False,
        "totalExact": True,
    }


def test_fetch_postbacks_sorts_oldest_first_on_request(shop, history):
    conversions, _ = shop.list(sortOrder="asc")
    assert ids(conversions) == list(history.values())


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"eventType": "lead"}, ["deal_lead"]),
        ({"eventType": "purchase"}, ["unknown_code", "campaign_purchase", "deal_purchase"]),
        ({"linkCode": "GLOW25"}, ["deal_lead", "deal_purchase"]),
        ({"linkCode": "MYSTERY"}, ["unknown_code"]),
        ({"linkCode": "glow25"}, []),
        (
            {"attributed": "true"},
            ["unknown_code", "deal_lead", "campaign_purchase", "deal_purchase"],
        ),
        ({"attributed": "false"}, ["signup"]),
        ({"eventType": "purchase", "linkCode": "GLOW25"}, ["deal_purchase"]),
    ],
)
def test_fetch_postbacks_filters(shop, history, query, expected):
    conversions, meta = shop.list(**query)

    assert ids(conversions) == [history[name] for name in expected]
    assert meta["total"] == len(expected)


def test_fetch_postbacks_filters_by_campaign_and_deal(shop, history):
    by_campaign, _ = shop.list(campaignId=shop.campaign)
    by_deal, _ = shop.list(dealId=shop.deal)

    assert ids(by_campaign) == [
        history["deal_lead"],
        history["campaign_purchase"],
        history["deal_purchase"],
    ]
    assert ids(by_deal) == [history["deal_lead"], history["deal_purchase"]]


def test_fetch_postbacks_pages(shop, history):
    first, meta = shop.list(limit=2)
    third, last = shop.list(limit=2, page=3)

    assert ids(first) == [history["signup"], history["unknown_code"]]
    assert (meta["totalPages"], meta["hasNext"]) == (3, True)
    assert ids(third) == [history["deal_purchase"]]
    assert last["hasNext"] is False


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"campaignId": "deal_01jd3kf7g9h1j3k5m7n9p1q3r5"}, "campaignId"),
        ({"dealId": "cmp_01jd3kb2c4d6e8f0g2h4j6k8m0"}, "dealId"),
        ({"attributed": "maybe"}, "attributed"),
        ({"sortOrder": "newest"}, "sortOrder"),
        ({"eventType": ""}, "eventType"),
        ({"linkCode": "l" * 101}, "linkCode"),
        ({"limit": "0"}, "limit"),
        ({"limit": "101"}, "limit"),
        ({"page": "0"}, "page"),
        ({"status": "pending"}, "status"),
    ],
)
def test_fetch_postbacks_refuses_bad_parameters(shop, query, field):
    response = shop.client.get(
        route(shop.brand, "fetch-postbacks"),
        query_string=query,
        headers={"X-Api-Key": shop.read_key},
    )
    assert field in assert_error(response, 400, "VALIDATION_ERROR")["errors"]


def test_another_brands_conversions_are_neither_listed_nor_readable(app, client, make_key, shop):
    other = Shop(app, client, make_key, name="Other Brand", suffix="o")
    theirs = assert_success(other.post(PURCHASE | {"linkCode": "GLOW25o"}), 201)["conversionId"]

    assert shop.list() == ([], shop.list()[1])
    assert shop.list(campaignId=other.campaign)[0] == []
    response = client.get(route(shop.brand, theirs), headers={"X-Api-Key": shop.read_key})
    assert_error(response, 404, "NOT_FOUND")
    response = client.get(route(shop.brand, theirs), headers={"X-Api-Key": other.read_key})
    assert_error(response, 403, "FORBIDDEN")


def test_fetch_conversion_of_an_unknown_id_is_not_found(shop):
    response = shop.client.get(
        route(shop.brand, "conv_01jd3km1n3p5q7r9s1t3v5w7x9"), headers={"X-Api-Key": shop.read_key}
    )
    assert_error(response, 404, "NOT_FOUND")


def test_reading_conversions_needs_a_key(shop):
    assert_error(shop.client.get(route(shop.brand, "fetch-postbacks")), 401, "UNAUTHORIZED")


# ---------------------------------------------------------------------------------------------
# The OpenAPI document


def test_the_openapi_document_describes_the_postback_contract(client):
    document = client.get("/api/v1/openapi.json").get_json()
    operation = document["paths"]["/brand/{brandId}/conversion/record-postback"]["post"]

    [header] = [p for p in operation["parameters"] if p["in"] == "header"]
    assert (header["name"], header["required"]) == ("Idempotency-Key", True)
    assert header["schema"]["pattern"] == "^[A-Za-z0-9_:-]{16,128}$"
    assert {"200", "201", "400", "401", "403", "409", "413"} <= set(operation["responses"])
    assert "any API key of the brand" in operation["description"]
    listing = document["paths"]["/brand/{brandId}/conversion/fetch-postbacks"]["get"]
    assert {p["name"] for p in listing["parameters"] if p["in"] == "query"} == {
        "page",
        "limit",
        "eventType",
        "linkCode",
        "campaignId",
        "dealId",
        "attributed",
        "sortOrder",
    }
    assert "/brand/{brandId}/conversion/{conversionId}" in document["paths"]


# ---------------------------------------------------------------------------------------------
# The demo workspace's postbacks


def test_the_demo_workspace_has_postbacks_that_agree_with_its_links(app, client, make_key):
    from fixtures.demo import seed_demo_workspace
    from fixtures.demo_simulation import simulate_step

    with app.app_context():
        brand_id = seed_demo_workspace().brand.id
        db.session.commit()
    key = make_key(brand_id, scopes=("read",))
    seeded = len(recorded_events(app, brand_id))
    for _ in range(15):  # the demo moves on; measuring a post's clicks also sells on its link
        with app.app_context():
            simulate_step(brand_id=brand_id)
            db.session.commit()
    announced = len(recorded_events(app, brand_id))

    def everything(path: str, name: str) -> list[dict]:
        response = client.get(
            f"/api/v1/brand/{brand_id}/{path}",
            query_string={"limit": 100},
            headers={"X-Api-Key": key},
        )
        return assert_success(response)[name]

    conversions = everything("conversion/fetch-postbacks", "conversions")
    links = everything("tracked-link/fetch-links", "links")

    assert announced > seeded > 0
    assert len(conversions) == announced  # each conversion announced once, seeded or simulated
    assert {c["attributed"] for c in conversions} == {True, False}
    assert any(c["linkCode"] and c["linkId"] is None for c in conversions)  # a retired code
    assert {c["currency"] for c in conversions} == {"NGN", "USD"}
    for link in links:
        on_link = [c for c in conversions if c["linkId"] == link["id"]]
        assert link["conversions"] == len(on_link), link["code"]
        assert link["conversionValueMinor"] == sum(c["valueMinor"] for c in on_link)
        assert all(c["campaignId"] == link["campaignId"] for c in on_link)
    assert sum(link["conversions"] for link in links) > 0
