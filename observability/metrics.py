"""The service's Prometheus instruments, one definition each (CONTRACT 9.2).

With `PROMETHEUS_MULTIPROC_DIR` set before this module is first imported (as `make run` does and
docs/operations.md asks of a deployment), every process writes its samples to files in that
directory and `GET /metrics` sums them, so gunicorn's workers and the delivery workers are all
counted. Without it the numbers are those of the answering process alone.
"""

from __future__ import annotations

import os

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily

MULTIPROCESS_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"

REQUESTS = Counter(
    "brand_api_http_requests_total",
    "HTTP requests answered, by operation (the API's operationId, else the route), method and "
    "status.",
    ["operation", "method", "status"],
)
REQUEST_DURATION = Histogram(
    "brand_api_http_request_duration_seconds",
    "Time from a request's arrival to its answer, by operation.",
    ["operation"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
DELIVERY_ATTEMPTS = Counter(
    "brand_api_webhook_attempts_total",
    "Webhook delivery attempts, by outcome: succeeded, http_error (the receiver answered "
    "outside 2xx), timeout, network_error (no answer: refused, reset, DNS, TLS) or not_sent.",
    ["outcome"],
)
DELIVERY_ATTEMPT_DURATION = Histogram(
    "brand_api_webhook_attempt_duration_seconds",
    "Wall-clock time of one delivery attempt, by outcome.",
    ["outcome"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
ENDPOINTS_DISABLED_BY_SERVICE = Counter(
    "brand_api_webhook_endpoints_disabled_total",
    "Endpoints the service disabled (repeated failures or 410 Gone).",
)
RATE_LIMITED = Counter(
    "brand_api_rate_limited_requests_total",
    "Requests refused with 429 RATE_LIMITED, by limit (api, postback, sign_in_failures, "
    "sign_in_failures_global, event_waits_per_key, event_waits_per_process).",
    ["limit"],
)
EVENT_WAITS = Gauge(
    "brand_api_event_waits",
    "Long-polls of the events API waiting now, admitted under the caps, summed over the live "
    "server processes.",
    multiprocess_mode="livesum",
)
RATE_LIMITS_UNCHECKED = Counter(
    "brand_api_rate_limit_unchecked_requests_total",
    "Requests allowed without a rate-limit check because Redis could not be asked.",
)
RETENTION_DELETED = Counter(
    "brand_api_retention_deleted_rows_total",
    "Rows the retention purge deleted, by table (deliveries, attempts, events).",
    ["table"],
)
BACKING_SERVICE_ERRORS = Counter(
    "brand_api_backing_service_errors_total",
    "Failures to reach the database or Redis, by service and by who noticed (request, "
    "rate_limiter, worker).",
    ["service", "component"],
)


def count_backing_service_error(service: str, component: str) -> None:
    BACKING_SERVICE_ERRORS.labels(service=service, component=component).inc()


def exposition(extra_families) -> tuple[bytes, str]:
    """The text format of every process's samples (or this process's, without a multiprocess
    directory), followed by `extra_families`: gauges read at scrape time."""
    if os.environ.get(MULTIPROCESS_DIR_VARIABLE):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    else:
        registry = REGISTRY
    body = generate_latest(registry)
    extra = CollectorRegistry()
    extra.register(_Families(extra_families))
    return body + generate_latest(extra), CONTENT_TYPE_LATEST


class _Families:
    def __init__(self, families) -> None:
        self.families = families

    def collect(self):
        return self.families


def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def labelled_gauge(
    name: str, documentation: str, labels: list[str], samples: list[tuple[list[str], float]]
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=labels)
    for values, value in samples:
        family.add_metric(values, value)
    return family


def mark_process_dead(pid: int) -> None:
    """Called by gunicorn when a worker exits, as prometheus_client's multiprocess mode asks."""
    if os.environ.get(MULTIPROCESS_DIR_VARIABLE):
        multiprocess.mark_process_dead(pid)


def count_request(operation: str, method: str, status: int, seconds: float) -> None:
    REQUESTS.labels(operation=operation, method=method, status=str(status)).inc()
    REQUEST_DURATION.labels(operation=operation).observe(seconds)


def count_attempt(outcome: str, seconds: float) -> None:
    DELIVERY_ATTEMPTS.labels(outcome=outcome).inc()
    DELIVERY_ATTEMPT_DURATION.labels(outcome=outcome).observe(seconds)
