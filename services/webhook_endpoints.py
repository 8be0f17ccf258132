"""Webhook endpoints: registered, listed, updated, re-keyed, disabled, deleted and pinged
(SPEC sections 2-4, CONTRACT 4 and 6)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import cast

from flask import current_app
from sqlalchemy import CursorResult, func, select, update

from extensions import db
from models import ApiKey, Campaign, WebhookEndpoint, credentials
from models.bulk_job import RELEASE_HELD, RETRY_NOW
from models.columns import utcnow
from models.event_catalog import (
    DEFAULT_SUBSCRIPTION,
    EVENT_NAMES,
    TEST_EVENT,
    is_event_name,
    sample_data,
    supported_events,
)
from models.webhook_endpoint import (
    DISABLED_REASON_MAX_LENGTH,
    MAX_CAMPAIGN_FILTER,
    NO_ORDERING,
)
from schemas.events import event_data
from services.brands import get_brand
from services.delivery.backlog import waiting_retries
from services.delivery.bulk import request_job
from services.delivery.health import close_queue, disable_endpoint, enable_endpoint
from services.endpoint_urls import UrlPolicy, validate_endpoint_url
from services.errors import Conflict, NotFound, ValidationFailed
from services.events import PublishedEvent, publish_event
from services.secret_box import InvalidToken, secret_box

# Every endpoint multiplies each event's deliveries; a brand needing more is worth a word.
MAX_ENDPOINTS_PER_BRAND = 20
TEST_MESSAGE = "Test ping from the Brand API: your endpoint is reachable."
# Where a person changed an endpoint, in the words its page and its deliveries' errors use.
FROM_THE_DASHBOARD = "from the dashboard"
THROUGH_THE_API = "through the API"


@dataclass(frozen=True)
class ChangedBy:
    """Who changed an endpoint by hand, and where: the key they used (its id) and a place such
    as FROM_THE_DASHBOARD. A disabled endpoint's reason is written from it."""

    place: str
    key_id: str | None = None


@dataclass(frozen=True)
class Subscription:
    """What a request's `events` comes to: the names subscribed, and the unsupported names that
    were dropped (CONTRACT 10: the answer lists them, so a typo does not go unnoticed)."""

    events: list[str]
    dropped_events: list[str]


@dataclass(frozen=True)
class IssuedEndpoint:
    """An endpoint with its signing secret, as returned once by register and rotate, and the
    event names registration dropped."""

    record: WebhookEndpoint
    signing_secret: str
    dropped_events: list[str] = field(default_factory=list)

    def __getattr__(self, name: str):
        # The endpoint plus what this answer adds; schemas read the rest from the record.
        return getattr(self.record, name)


@dataclass(frozen=True)
class UpdatedEndpoint:
    """An endpoint after update-endpoint, and the event names the update dropped."""

    record: WebhookEndpoint
    dropped_events: list[str]

    def __getattr__(self, name: str):
        return getattr(self.record, name)


def current_url_policy() -> UrlPolicy:
    return UrlPolicy.for_environment(current_app.extensions["settings"].app_env)


def register_endpoint(
    *,
    brand_id: str,
    url: str,
    events: list[str] | None,
    policy: UrlPolicy,
    description: str | None = None,
    ordering: str = NO_ORDERING,
    campaign_ids: list[str] | None = None,
    max_in_flight: int | None = None,
    trace_context: bool = False,
    now: datetime | None = None,
) -> IssuedEndpoint:
    """:raise ValidationFailed: a URL against CONTRACT 6.3, no supported event, or a campaign
        that is not the brand's (CONTRACT 12.3).
    :raise Conflict: the brand has `MAX_ENDPOINTS_PER_BRAND` endpoints already."""
    get_brand(brand_id)
    url = validate_endpoint_url(url, policy)
    subscription = resolve_subscription(events)
    campaign_filter = resolve_campaign_filter(brand_id, campaign_ids)
    active_count = db.session.execute(
        select(func.count()).where(
            WebhookEndpoint.brand_id == brand_id, WebhookEndpoint.deleted_at.is_(None)
        )
    ).scalar_one()
    if active_count >= MAX_ENDPOINTS_PER_BRAND:
        # A conflict with the brand's state, not a malformed request: the same request succeeds
        # once an endpoint is deleted (RFC 9110, 409).
        raise Conflict(
            f"A brand may have at most {MAX_ENDPOINTS_PER_BRAND} endpoints; delete one first"
        )
    now = now or utcnow()
    secret = credentials.generate_signing_secret()
    endpoint = WebhookEndpoint(
        brand_id=brand_id,
        url=url,
        description=description,
        events=subscription.events,
        ordering=ordering,
        campaign_ids=campaign_filter,
        max_in_flight=max_in_flight,
        trace_context=trace_context,
        secret_ciphertext=secret_box().encrypt(secret),
        consecutive_failures=0,
        created_at=now,
        updated_at=now,
    )
    db.session.add(endpoint)
    db.session.flush()
    return IssuedEndpoint(
        record=endpoint, signing_secret=secret, dropped_events=subscription.dropped_events
    )


def resolve_subscription(events: list[str] | None) -> Subscription:
    """SPEC registration rules 1 and 2: omitted means the default; unsupported names are
    dropped (and reported, each once, in the order given); nothing supported left is an error
    that names what was dropped."""
    if events is None:
        return Subscription(events=list(DEFAULT_SUBSCRIPTION), dropped_events=[])
    subscribed = supported_events(events)
    dropped = list(dict.fromkeys(name for name in events if name not in subscribed))
    if not subscribed:
        unsupported = f"Not supported: {', '.join(dropped)}. " if dropped else ""
        raise ValidationFailed(
            "No supported event in the subscription",
            {"events": [f"{unsupported}Give at least one of: {', '.join(EVENT_NAMES)}."]},
        )
    return Subscription(events=subscribed, dropped_events=dropped)


def resolve_campaign_filter(brand_id: str, campaign_ids: list[str] | None) -> list[str] | None:
    """CONTRACT 12.3: the brand's campaigns an endpoint takes events of, each once, in the order
    given; None (every campaign) for none.

    :raise ValidationFailed: an id that is not a campaign of the brand (named), or too many."""
    if not campaign_ids:
        return None
    wanted = list(dict.fromkeys(campaign_ids))
    if len(wanted) > MAX_CAMPAIGN_FILTER:
        raise ValidationFailed(
            "Too many campaigns in the filter",
            {"campaignIds": [f"At most {MAX_CAMPAIGN_FILTER} campaigns."]},
        )
    found = set(
        db.session.scalars(
            select(Campaign.id).where(Campaign.brand_id == brand_id, Campaign.id.in_(wanted))
        )
    )
    unknown = [campaign_id for campaign_id in wanted if campaign_id not in found]
    if unknown:
        raise ValidationFailed(
            "Not the brand's campaigns",
            {"campaignIds": [f"No campaign with id {', '.join(unknown)} in this brand."]},
        )
    return wanted


def list_endpoints(brand_id: str) -> list[WebhookEndpoint]:
    """The brand's endpoints (active and disabled; not deleted), oldest first."""
    return list(
        db.session.scalars(
            select(WebhookEndpoint)
            .where(WebhookEndpoint.brand_id == brand_id, WebhookEndpoint.deleted_at.is_(None))
            .order_by(WebhookEndpoint.created_at, WebhookEndpoint.id)
        )
    )


def get_endpoint(brand_id: str, endpoint_id: str, *, for_update: bool = False) -> WebhookEndpoint:
    """:raise NotFound: no such endpoint in this brand, or it was deleted."""
    statement = select(WebhookEndpoint).where(
        WebhookEndpoint.id == endpoint_id,
        WebhookEndpoint.brand_id == brand_id,
        WebhookEndpoint.deleted_at.is_(None),
    )
    if for_update:
        # Serialises changes of one endpoint against each other and the worker's health
        # updates (which skip a row someone holds); publishers' KEY SHARE locks do not wait.
        statement = statement.with_for_update(key_share=True)
    endpoint = db.session.scalar(statement)
    if endpoint is None:
        raise NotFound(f"No webhook endpoint with id {endpoint_id!r} in this brand")
    return endpoint


_UNSET = object()


def update_endpoint(
    *,
    brand_id: str,
    endpoint_id: str,
    policy: UrlPolicy,
    url=_UNSET,
    events=_UNSET,
    description=_UNSET,
    is_active=_UNSET,
    ordering=_UNSET,
    campaign_ids=_UNSET,
    max_in_flight=_UNSET,
    trace_context=_UNSET,
    changed_by: ChangedBy | None = None,
    now: datetime | None = None,
) -> UpdatedEndpoint:
    """Change any of `url`, `events`, `description`, `isActive`, `ordering`, `campaignIds`,
    `maxInFlight`, `traceContext` (CONTRACT 4, 10, 12 and 13). Turning ordering off lets every
    delivery held behind an earlier one of its subject go (a bulk job, within seconds); turning
    it on orders the events published from then on. A new in-flight limit holds from the next
    claim on (attempts on the wire finish); a null one is the setting's.
    `isActive: true` re-enables a disabled endpoint with a clean failure count; `false` disables
    it, failing its pending deliveries, with a reason that says who did it and where
    (`changed_by`). An empty or null description removes it.

    :raise ValidationFailed: a field breaks its rule (an empty request is the schema's to
        refuse, `EndpointUpdateSchema`).
    :raise NotFound: no such endpoint.
    """
    now = now or utcnow()
    new_url = validate_endpoint_url(url, policy) if url is not _UNSET else None
    subscription = resolve_subscription(events) if events is not _UNSET else None
    campaign_filter = (
        resolve_campaign_filter(brand_id, campaign_ids) if campaign_ids is not _UNSET else _UNSET
    )
    endpoint = get_endpoint(brand_id, endpoint_id, for_update=True)
    if campaign_filter is not _UNSET:
        endpoint.campaign_ids = campaign_filter
    if ordering is not _UNSET and ordering != endpoint.ordering:
        endpoint.ordering = ordering
        if ordering == NO_ORDERING:
            request_job(
                kind=RELEASE_HELD,
                brand_id=brand_id,
                endpoint_id=endpoint.id,
                now=now,
                first_batch=True,
            )
    if new_url is not None:
        endpoint.url = new_url
    if subscription is not None:
        endpoint.events = subscription.events
    if description is not _UNSET:
        endpoint.description = description
    if max_in_flight is not _UNSET:
        endpoint.max_in_flight = max_in_flight
    if trace_context is not _UNSET:
        endpoint.trace_context = trace_context
    endpoint.updated_at = now
    db.session.flush()
    if is_active is True:
        enable_endpoint(endpoint.id, now=now)
    elif is_active is False:
        disable_endpoint(
            endpoint.id,
            reason=disabled_by_hand(brand_id, changed_by),
            now=now,
            first_batch=True,
        )
    if is_active is not _UNSET:
        db.session.refresh(endpoint)  # delivery.health changed the row beneath the session
    dropped = subscription.dropped_events if subscription is not None else []
    return UpdatedEndpoint(record=endpoint, dropped_events=dropped)


def disabled_by_hand(brand_id: str, changed_by: ChangedBy | None) -> str:
    """What a disabled endpoint's page says of it: "Disabled from the dashboard by key “ops”
    (svc_live_ab12…)", "Disabled through the API by key …". A key names itself by its name and
    prefix, as the keys page lists it: never its secret."""
    if changed_by is None:
        return "Disabled by hand"
    reason = f"Disabled {changed_by.place}"
    key = (
        db.session.scalar(
            select(ApiKey).where(ApiKey.id == changed_by.key_id, ApiKey.brand_id == brand_id)
        )
        if changed_by.key_id
        else None
    )
    if key is not None:
        reason += f" by key “{key.name}” ({key.key_prefix}…)"
    return reason[:DISABLED_REASON_MAX_LENGTH]


def rotate_signing_secret(
    *,
    brand_id: str,
    endpoint_id: str,
    overlap_seconds: int = 0,
    now: datetime | None = None,
) -> IssuedEndpoint:
    """A new signing secret (CONTRACT 8.2). Without an overlap it alone signs from the next
    attempt on, retries included. With one, the secret it replaces signs beside it until the
    overlap ends, so that the brand deploys the new one to its receivers at its own pace; a
    rotation during an overlap starts a new one, and the secret before the replaced one stops
    signing at once."""
    now = now or utcnow()
    endpoint = get_endpoint(brand_id, endpoint_id, for_update=True)
    secret = credentials.generate_signing_secret()
    if overlap_seconds > 0:
        endpoint.previous_secret_ciphertext = endpoint.secret_ciphertext
        endpoint.previous_secret_expires_at = now + timedelta(seconds=overlap_seconds)
    else:
        endpoint.previous_secret_ciphertext = None
        endpoint.previous_secret_expires_at = None
    endpoint.secret_ciphertext = secret_box().encrypt(secret)
    endpoint.updated_at = now
    db.session.flush()
    return IssuedEndpoint(record=endpoint, signing_secret=secret)


def signs_with_an_older_secret(endpoint: WebhookEndpoint) -> bool:
    """True when the endpoint's current signing secret was issued before secrets were base64
    (CONTRACT 12.1): Standard Webhooks libraries need it as bytes until it is rotated. A secret
    no configured key decrypts (the worker cannot sign with it either) counts as current."""
    try:
        secret = secret_box().decrypt(endpoint.secret_ciphertext)
    except InvalidToken:
        return False
    return not credentials.is_base64_signing_secret(secret)


def forget_expired_previous_secrets(*, now: datetime) -> int:
    """Destroy the ciphertext of every previous secret whose overlap has ended (the worker's
    sweep runs this); how many."""
    result = db.session.execute(
        update(WebhookEndpoint)
        .where(WebhookEndpoint.previous_secret_expires_at <= now)
        .values(previous_secret_ciphertext=None, previous_secret_expires_at=None)
        .execution_options(synchronize_session=False)
    )
    # Session.execute is typed for any statement; an UPDATE's result is a CursorResult.
    forgotten = cast(CursorResult, result).rowcount
    db.session.commit()
    return forgotten


def delete_endpoint(
    *, brand_id: str, endpoint_id: str, now: datetime | None = None
) -> WebhookEndpoint:
    """Delete the endpoint; its pending deliveries end as `failed` (a bulk job, at once for
    what is queued: nothing more is attempted), its log stays readable."""
    now = now or utcnow()
    endpoint = get_endpoint(brand_id, endpoint_id, for_update=True)
    endpoint.deleted_at = now
    endpoint.updated_at = now
    db.session.flush()
    close_queue(brand_id, endpoint.id, why="Endpoint deleted", now=now, first_batch=True)
    return endpoint


def retry_pending(*, brand_id: str, endpoint_id: str, now: datetime | None = None) -> int:
    """CONTRACT 12.4: every pending delivery of the endpoint waiting for a retry becomes due now
    (the claim keeps its in-flight limit, and a receiver's Retry-After is overridden: a person
    said it is fixed); how many wait now. A bulk job brings them forward: its first thousand in
    this request, the rest a thousand a batch in the workers.

    :raise NotFound: no such endpoint, or it is disabled or deleted."""
    endpoint = get_endpoint(brand_id, endpoint_id)
    if not endpoint.is_active:
        raise NotFound(
            f"Webhook endpoint {endpoint_id!r} is disabled; re-enable it with update-endpoint "
            "and its failed deliveries can be recovered"
        )
    due = waiting_retries(endpoint.id, now=now)
    if due:
        request_job(
            kind=RETRY_NOW,
            brand_id=brand_id,
            endpoint_id=endpoint.id,
            now=now,
            first_batch=True,
        )
    return due


def send_test_ping(*, brand_id: str, endpoint_id: str, now: datetime | None = None) -> str:
    """Queue `webhook.test` to this endpoint whatever its subscriptions; the delivery id.

    :raise NotFound: no such endpoint, or it is disabled (SPEC section 3).
    """
    endpoint = _open_endpoint(brand_id, endpoint_id, "sending a test")
    published = publish_event(
        brand_id=brand_id,
        name=TEST_EVENT,
        data=event_data(TEST_EVENT, {"endpoint_id": endpoint.id, "message": TEST_MESSAGE}),
        only_endpoint_ids=[endpoint.id],
        now=now,
    )
    return published.delivery_ids[0]


def send_example_event(
    *,
    brand_id: str,
    endpoint_id: str,
    name: str,
    data: dict | None = None,
    now: datetime | None = None,
) -> PublishedEvent:
    """Publish the event `name` to this endpoint alone, whatever its subscriptions, with the
    catalogue's sample `data` unless given: a real event, signed and logged like any delivery
    (Svix's "send example"), so a receiver can be tried on an event before one happens. The
    sample's ids are samples, not records of the brand.

    :raise NotFound: no such endpoint, or it is disabled.
    :raise ValidationFailed: `name` is no event, or `data` is not an object.
    """
    if not is_event_name(name):
        raise ValidationFailed(
            "Unknown event name", {"eventName": [f"Must be one of: {', '.join(EVENT_NAMES)}."]}
        )
    endpoint = _open_endpoint(brand_id, endpoint_id, "sending it an event")
    return publish_event(
        brand_id=brand_id,
        name=name,
        data=sample_data(name) if data is None else data,
        only_endpoint_ids=[endpoint.id],
        now=now,
    )


def _open_endpoint(brand_id: str, endpoint_id: str, doing: str) -> WebhookEndpoint:
    """The endpoint, when it may receive something now.

    :raise NotFound: no such endpoint, or it is disabled (SPEC section 3, for the test ping).
    """
    endpoint = get_endpoint(brand_id, endpoint_id)
    if not endpoint.is_active:
        raise NotFound(
            f"Webhook endpoint {endpoint_id!r} is disabled; re-enable it with update-endpoint "
            f"before {doing}"
        )
    return endpoint
