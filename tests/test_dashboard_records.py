"""The dashboard's read-only record pages: conversions (filters, paging, one conversion), tracked
links with their counters, and the event catalogue with samples and subscriptions."""

from __future__ import annotations

import html
import json
import re
from datetime import UTC, datetime, timedelta

import pytest

from extensions import db
from models.event_catalog import DEFAULT_SUBSCRIPTION, EVENT_NAMES, TEST_EVENT, sample_data
from schemas.tracked_links import TrackedLinkSchema
from services.postbacks import Postback, record_postback
from services.tracked_links import get_link
from services.webhook_endpoints import current_url_policy, register_endpoint
from tests.dashboard import htmx, sign_in
from tests.helpers import EVENT_ENVELOPE_KEYS
from tests.platform_factory import PlatformFactory

AT = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
CONVERSION_ROW = re.compile(r'<tr id="conversion-(conv_[^"]+)"')
LINK_ROW = re.compile(r'<tr id="link-(lnk_[^"]+)"')


# ---- helpers ----


def _shop(app, brand_id: str, prefix: str = "") -> dict:
    """A published campaign, an accepted deal, a deal link and a campaign-wide link."""
    factory = PlatformFactory(app)
    campaign = factory.campaign(brand_id, at=AT, published_at=AT + timedelta(hours=1))
    deal = factory.deal(campaign, at=AT + timedelta(hours=2), accepted_at=AT + timedelta(hours=3))
    deal_link = factory.link(campaign, f"{prefix}GLOW25", deal_id=deal, at=AT + timedelta(hours=4))
    wide_link = factory.link(campaign, f"{prefix}WIDE10", at=AT + timedelta(hours=5))
    factory.clicks(deal_link, 40, at=AT + timedelta(hours=6))
    return {
        "campaign": campaign,
        "deal": deal,
        "deal_link": deal_link,
        "wide_link": wide_link,
        "deal_code": f"{prefix}GLOW25",
        "wide_code": f"{prefix}WIDE10",
    }


def _postback(app, brand_id: str, key: str, minute: int, **body) -> str:
    """Record one postback through the service, as the API route does; its conversion id."""
    with app.app_context():
        outcome = record_postback(
            brand_id=brand_id,
            idempotency_key=key,
            postback=Postback(**body),
            now=AT + timedelta(days=1, minutes=minute),
        )
        db.session.commit()
        return outcome.conversion.id


def _conversions(app, brand_id: str, shop: dict) -> dict[str, str]:
    """Five conversions of every kind, oldest first: name -> id."""
    return {
        "deal": _postback(
            app,
            brand_id,
            "order-0001-purchase",
            1,
            event_type="purchase",
            link_code=shop["deal_code"],
            value_minor=1_250_000,
            metadata={"orderId": "ORD-1", "items": [1, 2]},
        ),
        "wide": _postback(
            app,
            brand_id,
            "order-0002-purchase",
            2,
            event_type="purchase",
            link_code=shop["wide_code"],
            value_minor=300_000,
        ),
        "lead": _postback(
            app, brand_id, "lead-000000000003", 3, event_type="lead", click_id="clk_1"
        ),
        "unknown": _postback(
            app, brand_id, "order-0004-purchase", 4, event_type="purchase", link_code="NOPE99"
        ),
        "signup": _postback(app, brand_id, "signup-00000000005", 5, event_type="signup"),
    }


def _rows(response, pattern=CONVERSION_ROW) -> list[str]:
    return pattern.findall(response.get_data(as_text=True))


# ---- conversions ----


def test_conversions_list_shows_each_postback(app, client, brand, write_key):
    shop = _shop(app, brand)
    ids = _conversions(app, brand, shop)
    sign_in(client, write_key)
    response = client.get("/dashboard/conversions")
    assert response.status_code == 200
    page = response.get_data(as_text=True)
    assert "<h1>Conversions</h1>" in page
    assert _rows(response) == [
        ids["signup"],
        ids["unknown"],
        ids["lead"],
        ids["wide"],
        ids["deal"],
    ]
    for label in ["Time (UTC)", "Event type", "Value", "Link code", "Campaign / deal"]:
        assert re.search(rf"<th[^>]*>{re.escape(label)}</th>", page), label
    assert "<th>Idempotency key</th>" in page
    row = page[page.index(f'id="conversion-{ids["deal"]}"') :].split("</tr>")[0]
    row = row.replace("<wbr>", "")  # where a long key may break
    assert "12,500.00 NGN" in row
    assert shop["deal_code"] in row
    assert shop["campaign"] in row and shop["deal"] in row
    assert "Harmattan Glow launch" in row and "@adaeze.cooks" in row
    assert "order-0001-purchase" in row
    assert 'data-attribution="link">counted on your link' in row


def test_each_conversion_says_what_its_code_or_click_id_came_to(app, client, brand, read_key):
    """SPEC rule 2 makes an unknown code `attributed: true`; the page says precisely that it
    was not counted anywhere, instead of a green "attributed" beside it."""
    shop = _shop(app, brand)
    ids = _conversions(app, brand, shop)
    sign_in(client, read_key)
    page = client.get("/dashboard/conversions").get_data(as_text=True)

    def attribution(name: str) -> str:
        row = page[page.index(f'id="conversion-{ids[name]}"') :].split("</tr>")[0]
        cell = row.split('class="attribution">')[1].split("</td>")[0]
        return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", cell)).strip()

    # The code as sent, then what it came to, in one cell.
    assert attribution("deal") == f"{shop['deal_code']} counted on your link"
    assert attribution("wide") == f"{shop['wide_code']} counted on your link"
    assert attribution("unknown") == "NOPE99 code not recognised not counted on any link"
    assert attribution("lead") == "click id only not counted on any link"
    assert attribution("signup") == "not attributed"
    assert "badge-attributed" not in page
    detail = client.get(f"/dashboard/conversions/{ids['unknown']}").get_data(as_text=True)
    assert "code not recognised" in detail
    assert "<code>NOPE99</code> is none of your tracked links' codes" in detail
    assert "<code>attributed: true</code>" in detail


def test_one_conversion_shows_its_metadata_as_json(app, client, brand, read_key):
    shop = _shop(app, brand)
    ids = _conversions(app, brand, shop)
    sign_in(client, read_key)
    response = client.get(f"/dashboard/conversions/{ids['deal']}")
    assert response.status_code == 200
    page = response.get_data(as_text=True)
    assert "purchase</span> conversion</h1>" in page
    metadata = re.search(r'<pre class="block"><code>(.*?)</code></pre>', page, re.S).group(1)
    assert json.loads(html.unescape(metadata)) == {"orderId": "ORD-1", "items": [1, 2]}
    assert '\n  "orderId": "ORD-1"' in html.unescape(metadata)  # pretty-printed
    assert "12,500.00 NGN" in page
    assert "Harmattan Glow launch" in page and "@adaeze.cooks" in page
    assert f"/dashboard/conversions?linkCode={shop['deal_code']}" in page
    # the nav places it in the Conversions section
    assert '<a href="/dashboard/conversions" aria-current="page">Conversions</a>' in page
    listing = client.get("/dashboard/conversions").get_data(as_text=True)
    assert f'href="/dashboard/conversions/{ids["deal"]}"' in listing


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("eventType=lead", ["lead"]),
        ("eventType=purchase", ["unknown", "wide", "deal"]),
        ("linkCode={deal_code}", ["deal"]),
        ("linkCode=NOPE99", ["unknown"]),
        ("campaignId={campaign}", ["wide", "deal"]),
        ("dealId={deal}", ["deal"]),
        ("attributed=true", ["unknown", "lead", "wide", "deal"]),
        ("attributed=false", ["signup"]),
        ("sortOrder=asc", ["deal", "wide", "lead", "unknown", "signup"]),
        ("eventType=purchase&attributed=true&sortOrder=asc", ["deal", "wide", "unknown"]),
    ],
)
def test_conversion_filters(app, client, brand, read_key, query, expected):
    shop = _shop(app, brand)
    ids = _conversions(app, brand, shop)
    sign_in(client, read_key)
    query = query.format(**shop)
    response = client.get(f"/dashboard/conversions?{query}")
    assert response.status_code == 200
    assert _rows(response) == [ids[name] for name in expected]
    page = response.get_data(as_text=True)
    # the form shows what was chosen, and offers to clear it
    for pair in query.split("&"):
        name, value = pair.split("=")
        assert (
            f'name="{name}" value="{value}"' in page or f'<option value="{value}" selected>' in page
        ), pair
    assert "Clear filters" in page


def test_no_match_says_so_and_offers_to_clear(app, client, brand, read_key):
    _conversions(app, brand, _shop(app, brand))
    sign_in(client, read_key)
    page = client.get("/dashboard/conversions?eventType=refund").get_data(as_text=True)
    assert "No conversion matches these filters" in page


def test_conversions_page_by_page(app, client, brand, read_key):
    ids = _conversions(app, brand, _shop(app, brand))
    sign_in(client, read_key)
    first = client.get("/dashboard/conversions?limit=2&sortOrder=asc")
    assert _rows(first) == [ids["deal"], ids["wide"]]
    page = first.get_data(as_text=True)
    assert "Page 1 of 3 · 5 in all" in page
    next_url = html.unescape(re.search(r'href="([^"]+)"[^>]*>Next →', page).group(1))
    assert "page=2" in next_url and "limit=2" in next_url and "sortOrder=asc" in next_url
    second = client.get(next_url)
    assert _rows(second) == [ids["lead"], ids["unknown"]]
    third = client.get("/dashboard/conversions?limit=2&sortOrder=asc&page=3")
    assert _rows(third) == [ids["signup"]]
    assert "Next →" not in third.get_data(as_text=True)
    assert "← Previous" in third.get_data(as_text=True)


@pytest.mark.parametrize(
    ("query", "field", "message"),
    [
        ("campaignId=deal_01abc", "campaignId", "Not a campaign id"),
        ("dealId=cmp_01abc", "dealId", "Not a deal id"),
        ("attributed=maybe", "attributed", "Not a valid boolean"),
        ("sortOrder=sideways", "sortOrder", "Must be one of"),
        ("limit=500", "limit", "Must be greater than or equal to 1"),
        ("page=0", "page", "Must be greater than or equal to 1"),
    ],
)
def test_a_bad_conversion_filter_says_what_is_wrong(client, brand, read_key, query, field, message):
    token = sign_in(client, read_key)
    for headers in [{}, htmx(token)]:
        response = client.get(f"/dashboard/conversions?{query}", headers=headers)
        assert response.status_code == 422
        page = response.get_data(as_text=True)
        assert "These filters are not valid" in page
        assert f"<code>{field}</code>: {message}" in page
        assert ("<html" in page) is not bool(headers)


def test_htmx_filter_swaps_only_the_results(app, client, brand, read_key):
    ids = _conversions(app, brand, _shop(app, brand))
    token = sign_in(client, read_key)
    response = client.get("/dashboard/conversions?eventType=lead", headers=htmx(token))
    assert response.status_code == 200
    page = response.get_data(as_text=True)
    assert "<html" not in page and "<form" not in page
    assert page.lstrip().startswith('<div id="conversion-results">')
    assert _rows(response) == [ids["lead"]]
    assert "HX-Request" in response.headers["Vary"]
    # and the filter form asks for exactly that
    full = client.get("/dashboard/conversions").get_data(as_text=True)
    assert 'hx-get="/dashboard/conversions"' in full
    assert 'hx-target="#conversion-results"' in full
    assert 'hx-push-url="true"' in full
    assert 'method="get" action="/dashboard/conversions"' in full


def test_the_url_pushed_for_a_filter_leaves_out_its_empty_fields(app, client, brand, read_key):
    ids = _conversions(app, brand, _shop(app, brand))
    token = sign_in(client, read_key)
    # What the filter form sends when one of its selects is chosen: every field, most empty.
    sent = "/dashboard/conversions?eventType=lead&linkCode=&attributed=&sortOrder=desc"
    response = client.get(sent, headers=htmx(token))
    assert _rows(response) == [ids["lead"]]
    assert response.headers["HX-Push-Url"] == "/dashboard/conversions?eventType=lead&sortOrder=desc"
    cleared = client.get("/dashboard/conversions?eventType=&linkCode=", headers=htmx(token))
    assert cleared.headers["HX-Push-Url"] == "/dashboard/conversions"
    # A refused filter is pushed as sent, less its empty fields, so a reload shows the message.
    refused = client.get("/dashboard/conversions?eventType=&limit=0", headers=htmx(token))
    assert refused.status_code == 422
    assert refused.headers["HX-Push-Url"] == "/dashboard/conversions?limit=0"
    # Nothing to leave out, or no htmx (a plain form's GET): the URL is the browser's own.
    assert "HX-Push-Url" not in client.get(sent.split("&")[0], headers=htmx(token)).headers
    assert "HX-Push-Url" not in client.get(sent).headers


def test_the_empty_state_shows_how_to_send_a_postback(client, brand, write_key):
    sign_in(client, write_key)
    page = html.unescape(client.get("/dashboard/conversions").get_data(as_text=True))
    assert "No conversions yet" in page
    assert f"/api/v1/brand/{brand}/conversion/record-postback" in page
    assert '-H "X-Api-Key: $KEY"' in page
    assert "Idempotency-Key: " in page
    assert write_key not in page


def test_another_brands_conversions_never_show(app, client, brand, make_brand, read_key):
    ours = _conversions(app, brand, _shop(app, brand))
    other = make_brand("Other Co")
    theirs = _conversions(app, other, _shop(app, other, prefix="O"))
    sign_in(client, read_key)
    shown = set(_rows(client.get("/dashboard/conversions?limit=100")))
    assert shown == set(ours.values())
    for name, conversion_id in theirs.items():
        assert client.get(f"/dashboard/conversions/{conversion_id}").status_code == 404, name
    # their link code, even filtered for, finds nothing of theirs
    assert _rows(client.get("/dashboard/conversions?linkCode=OGLOW25")) == []
    assert client.get("/dashboard/conversions/conv_missing").status_code == 404


# ---- tracked links ----


def _link_row(page: str, link_id: str) -> str:
    return page[page.index(f'<tr id="link-{link_id}"') :].split("</tr>")[0]


def _counter(row: str, name: str) -> str:
    return re.search(rf'data-counter="{name}">([^<]+)</td>', row).group(1).strip()


def test_links_show_the_counters_the_api_shows(app, client, brand, read_key):
    shop = _shop(app, brand)
    _conversions(app, brand, shop)
    # a replay counts nothing again
    _postback(app, brand, "order-0001-purchase", 9, event_type="purchase", link_code="WIDE10")
    sign_in(client, read_key)
    response = client.get("/dashboard/links")
    assert response.status_code == 200
    page = response.get_data(as_text=True)
    assert "<h1>Tracked links</h1>" in page
    for label in ["Code", "Short URL", "Destination", "Clicks", "Conversions", "Campaign"]:
        assert re.search(rf"<th[^>]*>{label}</th>", page), label
    assert re.search(r"<th[^>]*>Conversion value</th>", page)
    assert _rows(response, LINK_ROW) == [shop["wide_link"], shop["deal_link"]]
    with app.app_context():
        api = {
            link_id: TrackedLinkSchema().dump(get_link(brand, link_id))
            for link_id in [shop["deal_link"], shop["wide_link"]]
        }
    assert (api[shop["deal_link"]]["conversions"], api[shop["wide_link"]]["conversions"]) == (1, 1)
    for link_id, link in api.items():
        row = _link_row(page, link_id)
        assert _counter(row, "clicks") == f"{link['clicks']:,}"
        assert _counter(row, "conversions") == f"{link['conversions']:,}"
        value = f"{link['conversionValueMinor'] / 100:,.2f} {link['currency']}"
        assert _counter(row, "conversionValue") == value
        assert link["shortUrl"] in row and html.escape(link["destinationUrl"]) in row
        assert "Harmattan Glow launch" in row and shop["campaign"] in row
    deal_row = _link_row(page, shop["deal_link"])
    assert _counter(deal_row, "clicks") == "40"
    assert _counter(deal_row, "conversionValue") == "12,500.00 NGN"
    # the code opens the conversions filtered by it
    href = re.search(r'<a href="([^"]+)"[^>]*><code>GLOW25</code>', deal_row).group(1)
    assert href == "/dashboard/conversions?linkCode=GLOW25"
    assert len(_rows(client.get(href))) == 1


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("code=GLOW25", ["deal_link"]),
        ("code=glow25", []),
        ("campaignId={campaign}", ["wide_link", "deal_link"]),
        ("dealId={deal}", ["deal_link"]),
    ],
)
def test_link_filters(app, client, brand, read_key, query, expected):
    shop = _shop(app, brand)
    sign_in(client, read_key)
    response = client.get(f"/dashboard/links?{query.format(**shop)}")
    assert response.status_code == 200
    assert _rows(response, LINK_ROW) == [shop[name] for name in expected]
    if not expected:
        assert "No tracked link matches these filters" in response.get_data(as_text=True)


def test_links_page_by_page_and_htmx_fragment(app, client, brand, read_key):
    shop = _shop(app, brand)
    token = sign_in(client, read_key)
    first = client.get("/dashboard/links?limit=1")
    assert _rows(first, LINK_ROW) == [shop["wide_link"]]
    assert "Page 1 of 2 · 2 in all" in first.get_data(as_text=True)
    second = client.get("/dashboard/links?limit=1&page=2", headers=htmx(token))
    page = second.get_data(as_text=True)
    assert "<html" not in page and page.lstrip().startswith('<div id="link-results">')
    assert _rows(second, LINK_ROW) == [shop["deal_link"]]
    assert 'hx-get="/dashboard/links?limit=1&amp;page=1"' in page
    # the answer is the whole region, so a page link must replace the region, not fill it
    previous = re.search(r'<a [^>]*hx-get="/dashboard/links\?limit=1&amp;page=1"[^>]*>', page)
    assert 'hx-target="#link-results"' in previous.group(0)
    assert 'hx-swap="outerHTML"' in previous.group(0)


def test_a_bad_link_filter_says_what_is_wrong(client, brand, read_key):
    token = sign_in(client, read_key)
    for headers in [{}, htmx(token)]:
        response = client.get("/dashboard/links?campaignId=nope", headers=headers)
        assert response.status_code == 422
        page = response.get_data(as_text=True)
        assert "<code>campaignId</code>: Not a campaign id" in page
    response = client.get("/dashboard/links?code=" + "x" * 200)
    assert response.status_code == 422
    assert "<code>code</code>" in response.get_data(as_text=True)


def test_another_brands_links_never_show(app, client, brand, make_brand, read_key):
    shop = _shop(app, brand)
    other = make_brand("Other Co")
    theirs = _shop(app, other, prefix="O")
    sign_in(client, read_key)
    assert set(_rows(client.get("/dashboard/links"), LINK_ROW)) == {
        shop["deal_link"],
        shop["wide_link"],
    }
    assert _rows(client.get("/dashboard/links?code=OGLOW25"), LINK_ROW) == []
    assert _rows(client.get(f"/dashboard/links?campaignId={theirs['campaign']}"), LINK_ROW) == []


def test_no_links_says_what_happens_next(client, brand, read_key):
    sign_in(client, read_key)
    page = client.get("/dashboard/links").get_data(as_text=True)
    assert "No tracked links yet" in page


# ---- events ----


def _event_entry(page: str, name: str) -> str:
    start = page.index(f'<article class="event-entry" id="{name}">')
    return page[start : page.index("</article>", start)]


def _register(app, brand_id: str, url: str, events: list[str]) -> str:
    with app.test_request_context():
        issued = register_endpoint(
            brand_id=brand_id, url=url, events=events, policy=current_url_policy()
        )
        db.session.commit()
        return issued.id


def _event_subject(page: str, name: str) -> str:
    found = re.search(r"Subject: <code>([a-z]+)</code>", _event_entry(page, name))
    assert found, name
    return found.group(1)


def test_event_types_page_lists_every_event_with_a_json_sample(client, brand, read_key):
    sign_in(client, read_key)
    response = client.get("/dashboard/event-types")
    assert response.status_code == 200
    page = response.get_data(as_text=True)
    assert "<h1>Event types</h1>" in page
    for name in EVENT_NAMES:
        entry = _event_entry(page, name)
        assert f'href="#{name}"' in page
        sample = re.search(r'<pre class="block[^"]*"[^>]*><code>(.*?)</code></pre>', entry, re.S)
        body = json.loads(html.unescape(sample.group(1)))
        assert set(body) == set(EVENT_ENVELOPE_KEYS)
        assert body["type"] == name
        assert body["brandId"] == brand
        assert body["data"] == sample_data(name)
        # The body's subject and sequence, as a publisher writes them, and the entry says it.
        assert body["sequence"] == 1
        assert f"Subject: <code>{body['subject']['type']}</code>" in entry
    assert "deal.completed" in page and 'class="muted subject-note"' in page
    subjects = {name: _event_subject(page, name) for name in EVENT_NAMES}
    assert subjects["deal.completed"] == subjects["escrow.released"] == "deal"
    assert subjects["campaign.published"] == "campaign"
    assert subjects["conversion.recorded"] == "conversion"
    assert subjects["webhook.test"] == "endpoint"
    assert subjects["verification.completed"] == "brand"
    for resource in {name.split(".")[0] for name in EVENT_NAMES}:
        assert f'<h2 id="resource-{resource}-title">{resource}</h2>' in page


def test_events_mark_the_default_subscription_and_the_subscribers(
    app, client, brand, make_brand, read_key
):
    first = _register(app, brand, "http://127.0.0.1:9/first", ["deal.completed", "escrow.held"])
    second = _register(app, brand, "http://127.0.0.1:9/second", ["escrow.held"])
    other = _register(
        app, make_brand("Other Co"), "http://127.0.0.1:9/other", list(EVENT_NAMES[:5])
    )
    sign_in(client, read_key)
    page = client.get("/dashboard/event-types").get_data(as_text=True)
    subscribers = {
        "deal.completed": {first},
        "escrow.held": {first, second},
    }
    for name in EVENT_NAMES:
        entry = _event_entry(page, name)
        assert ("badge-default" in entry) is (name in DEFAULT_SUBSCRIPTION), name
        linked = set(re.findall(r'href="/dashboard/endpoints/(whe_[^"]+)"', entry))
        assert linked == subscribers.get(name, set()), name
        assert other not in entry
        if name == TEST_EVENT:
            assert "Sent only to the endpoint you test" in entry
        elif name not in subscribers:
            assert "None of your endpoints subscribes to it" in entry


def test_read_scope_sees_every_record_page(app, client, brand, read_key):
    shop = _shop(app, brand)
    ids = _conversions(app, brand, shop)
    _register(app, brand, "http://127.0.0.1:9/hooks", ["conversion.recorded"])
    sign_in(client, read_key)
    for path in [
        "/dashboard/conversions",
        f"/dashboard/conversions/{ids['deal']}",
        "/dashboard/links",
        "/dashboard/events",
        "/dashboard/event-types",
    ]:
        response = client.get(path)
        assert response.status_code == 200, path
        assert "read</strong> scope" in response.get_data(as_text=True)
    assert len(_rows(client.get("/dashboard/conversions"))) == 5
    assert len(_rows(client.get("/dashboard/links"), LINK_ROW)) == 2


def test_record_pages_need_a_session(client):
    for path in [
        "/dashboard/conversions",
        "/dashboard/links",
        "/dashboard/events",
        "/dashboard/event-types",
    ]:
        response = client.get(path)
        assert response.status_code == 303
        assert response.headers["Location"].startswith("/dashboard/sign-in?next=")
