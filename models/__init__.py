"""The models, one module per concept; importing this package registers them all."""

from models.api_key import ApiKey
from models.bootstrap_token import BootstrapToken
from models.brand import Brand
from models.bulk_job import BulkJob
from models.campaign import Campaign
from models.conversion import Conversion
from models.dashboard_session import DashboardSession, OneTimeSecret
from models.deal import Deal
from models.delivery_queue import DeliveryLease, DeliveryLoopHeartbeat, QueuedDelivery
from models.endpoint_hours import EndpointHour
from models.escrow_hold import EscrowHold
from models.placement import Placement
from models.tracked_link import TrackedLink, TrackedLinkConversionCount
from models.webhook_delivery import WebhookAttempt, WebhookDelivery
from models.webhook_endpoint import WebhookEndpoint
from models.webhook_event import EventSubject, WebhookEvent

__all__ = [
    "ApiKey",
    "BootstrapToken",
    "Brand",
    "BulkJob",
    "Campaign",
    "Conversion",
    "DashboardSession",
    "Deal",
    "DeliveryLease",
    "DeliveryLoopHeartbeat",
    "EndpointHour",
    "EscrowHold",
    "EventSubject",
    "OneTimeSecret",
    "Placement",
    "QueuedDelivery",
    "TrackedLink",
    "TrackedLinkConversionCount",
    "WebhookAttempt",
    "WebhookDelivery",
    "WebhookEndpoint",
    "WebhookEvent",
]
