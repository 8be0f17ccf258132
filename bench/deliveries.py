"""Webhook delivery benchmark: one worker's throughput, the one-process ceiling, and the latency
from publish to receipt, in one run against PostgreSQL and Redis (see bench/README.md).

Run from the repository root:  .venv/bin/python -m bench.deliveries

1. worker: N events are published with `publish_event` in batches (each commit sends a
   wake-up), then ONE `flask --app app worker` process is started; the rate is N over
   the time from the receiver's first receipt (worker start-up excluded) until the database
   shows all N `delivered`.
2. ceiling: the same N deliveries are reset to pending, and a plain loop in this process posts
   the same bodies, signed with `services.signing.delivery_headers`, over one `requests.Session`
   and marks each delivered with one autocommitted UPDATE (psycopg).
3. latency: with an idle worker running, POST .../send-test through a gunicorn server,
   sequentially; from the moment the API call returns to the receiver's receipt (p50, p99).

The receiver is an asyncio HTTP/1.1 keep-alive server in its own process (this file run with
--receiver) that answers 200 at once and records when each X-Service-Delivery arrived, on the
system-wide monotonic clock shared with this process.

It prints progress on stderr and ends with one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    HttpRequests,
    Processes,
    app_settings,
    child_environ,
    log,
    percentile,
    run_benchmark,
    start_gunicorn,
)

EVENT_NAME = "conversion.recorded"
DELIVERY_HEADER = b"x-service-delivery"  # services.signing.DELIVERY_HEADER, lower-cased
STALL_SECONDS = 60.0  # no progress for this long aborts the run


# --------------------------------------------------------------------------------------------
# The receiver (a separate process)
# --------------------------------------------------------------------------------------------

_OK = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"


class _Receipts:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.at: dict[str, float] = {}
        self.count = 0
        self.duplicates = 0
        self.first: float | None = None
        self.last: float | None = None
        self.waiters: dict[str, list[asyncio.Future]] = {}

    def record(self, delivery_id: str, now: float) -> None:
        self.count += 1
        if self.first is None:
            self.first = now
        self.last = now
        if delivery_id in self.at:
            self.duplicates += 1
            return
        self.at[delivery_id] = now
        for waiter in self.waiters.pop(delivery_id, []):
            if not waiter.done():
                waiter.set_result(now)


class _ReceiverProtocol(HttpRequests):
    def __init__(self, receipts: _Receipts) -> None:
        super().__init__()
        self.receipts = receipts
        self.tasks: set[asyncio.Task] = set()

    def handle(self, method: bytes, target: str, headers: dict[bytes, bytes]) -> None:
        if method == b"POST":
            delivery_id = headers.get(DELIVERY_HEADER, b"").decode()
            self.receipts.record(delivery_id, time.monotonic())
            self.transport.write(_OK)
        else:
            task = asyncio.ensure_future(self._control(target))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _control(self, target: str) -> None:
        """GET /_stats, /_reset, /_wait?id=...&timeout=... (long poll): JSON answers."""
        parts = urlsplit(target)
        query = parse_qs(parts.query)
        receipts = self.receipts
        status, payload = 200, {}
        if parts.path == "/_stats":
            payload = {
                "count": receipts.count,
                "distinct": len(receipts.at),
                "duplicates": receipts.duplicates,
                "first": receipts.first,
                "last": receipts.last,
            }
        elif parts.path == "/_reset":
            receipts.reset()
        elif parts.path == "/_wait":
            delivery_id = query["id"][0]
            timeout = float(query.get("timeout", ["10"])[0])
            at = receipts.at.get(delivery_id)
            if at is None:
                waiter = asyncio.get_running_loop().create_future()
                receipts.waiters.setdefault(delivery_id, []).append(waiter)
                try:
                    at = await asyncio.wait_for(waiter, timeout)
                except TimeoutError:
                    status = 404
            payload = {"at": at}
        else:
            status = 404
        body = json.dumps(payload).encode()
        reason = b"OK" if status == 200 else b"Not Found"
        self.transport.write(
            b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (status, reason, len(body), body)
        )


async def _serve_receiver() -> None:
    loop = asyncio.get_running_loop()
    receipts = _Receipts()
    server = await loop.create_server(
        lambda: _ReceiverProtocol(receipts), "127.0.0.1", 0, backlog=256
    )
    print(server.sockets[0].getsockname()[1], flush=True)
    stop = loop.create_future()
    loop.add_signal_handler(signal.SIGTERM, stop.set_result, None)
    loop.add_signal_handler(signal.SIGINT, stop.set_result, None)
    await stop
    server.close()


def _serve_otlp_sink() -> None:
    """A collector stand-in for `--tracing`: takes each OTLP/HTTP export (POST /v1/traces),
    answers 200 at once, and counts exports and bytes (GET /_stats); it decodes nothing."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    counts = {"exports": 0, "bytes": 0}
    lock = threading.Lock()

    class Sink(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            size = len(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            with lock:
                counts["exports"] += 1
                counts["bytes"] += size
            self._answer(b"")

        def do_GET(self) -> None:
            with lock:
                self._answer(json.dumps(counts).encode())

        def _answer(self, body: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    print(server.server_address[1], flush=True)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever()


# --------------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------------


def start_receiver(processes: Processes) -> str:
    process = processes.start(
        "receiver",
        [sys.executable, str(Path(__file__).resolve()), "--receiver"],
        dict(os.environ),
        stdout=subprocess.PIPE,
    )
    port = int(process.stdout.readline())
    return f"http://127.0.0.1:{port}"


def start_otlp_sink(processes: Processes) -> str:
    process = processes.start(
        "otlp-sink",
        [sys.executable, str(Path(__file__).resolve()), "--otlp-sink"],
        dict(os.environ),
        stdout=subprocess.PIPE,
    )
    port = int(process.stdout.readline())
    return f"http://127.0.0.1:{port}"


def start_worker(processes: Processes, env: dict[str, str]) -> subprocess.Popen:
    return processes.start("worker", [sys.executable, "-m", "flask", "--app", "app", "worker"], env)


def start_api_server(processes: Processes, env: dict[str, str]) -> str:
    base, _ = start_gunicorn(processes, "gunicorn", "app:create_app()", env, ["--workers", "1"])
    return base


# --------------------------------------------------------------------------------------------
# The three measurements
# --------------------------------------------------------------------------------------------


def pending_count(conn, endpoint_id: str) -> int:
    return conn.execute(
        "SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = %s AND status = 'pending'",
        (endpoint_id,),
    ).fetchone()[0]


def publish(app, brand_id: str, count: int, batch: int) -> float:
    """Publish `count` events, committing every `batch`: each commit sends a wake-up."""
    from extensions import db
    from models.event_catalog import sample_data
    from services.events import publish_event

    data = sample_data(EVENT_NAME)
    started = time.monotonic()
    with app.app_context():
        for offset in range(0, count, batch):
            for _ in range(min(batch, count - offset)):
                publish_event(brand_id=brand_id, name=EVENT_NAME, data=data)
            db.session.commit()
        db.session.remove()
    return time.monotonic() - started


def measure_worker(
    processes, env, conn, control, endpoint_id: str, count: int, delivered_before: int = 0
) -> float:
    control.get("/_reset")
    worker = start_worker(processes, env)
    started = time.monotonic()
    log(f"worker pid {worker.pid} started; waiting for {count} deliveries")
    last_left, last_progress = count, started
    while True:
        left = pending_count(conn, endpoint_id)
        now = time.monotonic()
        if left == 0:
            done = now
            break
        if left != last_left:
            last_left, last_progress = left, now
        if worker.poll() is not None or now - last_progress > STALL_SECONDS:
            raise RuntimeError(f"worker stalled with {left} pending:\n" + processes.log_of(worker))
        time.sleep(0.02)
    stats = control.get("/_stats").json()
    processes.stop(worker)
    delivered = conn.execute(
        "SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = %s AND status = 'delivered'",
        (endpoint_id,),
    ).fetchone()[0]
    if delivered - delivered_before != count or stats["distinct"] != count:
        raise RuntimeError(f"expected {count} delivered, got {delivered}; receiver: {stats}")
    first = stats["first"]
    rate = count / (done - first)
    log(
        f"worker: start-up to first receipt {first - started:.2f}s; first receipt to all "
        f"delivered {done - first:.2f}s -> {rate:.0f}/s (receiver first->last "
        f"{(count - 1) / (stats['last'] - first):.0f}/s; from process start "
        f"{count / (done - started):.0f}/s; duplicates {stats['duplicates']})"
    )
    return rate


def measure_ceiling(app, conn, control, receiver_url: str, endpoint_id: str) -> float:
    import requests

    from services.secret_box import secret_box
    from services.signing import delivery_headers

    with app.app_context():
        ciphertext = conn.execute(
            "SELECT secret_ciphertext FROM webhook_endpoints WHERE id = %s", (endpoint_id,)
        ).fetchone()[0]
        secret = secret_box().decrypt(ciphertext)
    conn.execute(
        "UPDATE webhook_deliveries SET status = 'pending', delivered_at = NULL, "
        "next_attempt_at = now(), http_status = NULL WHERE endpoint_id = %s",
        (endpoint_id,),
    )
    rows = conn.execute(
        "SELECT d.id, d.event_name, e.body FROM webhook_deliveries d "
        "JOIN webhook_events e ON e.id = d.event_id WHERE d.endpoint_id = %s "
        "ORDER BY d.next_attempt_at, d.id",
        (endpoint_id,),
    ).fetchall()
    work = [(delivery_id, name, body.encode()) for delivery_id, name, body in rows]
    control.get("/_reset")
    session = requests.Session()
    session.trust_env = False
    url = f"{receiver_url}/hooks"
    mark = (
        "UPDATE webhook_deliveries SET status = 'delivered', delivered_at = now(), "
        "next_attempt_at = NULL, http_status = %s, attempt_count = attempt_count + 1 "
        "WHERE id = %s"
    )
    started = time.monotonic()
    for delivery_id, name, body in work:
        headers = delivery_headers(
            secret=secret,
            timestamp=int(time.time()),
            raw_body=body,
            event_name=name,
            event_id=delivery_id,
            delivery_id=delivery_id,
        )
        response = session.post(url, data=body, headers=headers, timeout=10)
        if response.status_code != 200:
            raise RuntimeError(f"receiver answered {response.status_code}")
        conn.execute(mark, (response.status_code, delivery_id))
    elapsed = time.monotonic() - started
    session.close()
    left = pending_count(conn, endpoint_id)
    stats = control.get("/_stats").json()
    if left or stats["distinct"] != len(work):
        raise RuntimeError(f"ceiling loop left {left} pending; receiver: {stats}")
    rate = len(work) / elapsed
    log(f"ceiling: {len(work)} in {elapsed:.2f}s -> {rate:.0f}/s")
    return rate


def measure_latency(processes, env, control, brand_id, endpoint_id, api_key, samples, warmup):
    import requests

    api = requests.Session()
    api.trust_env = False
    base = start_api_server(processes, env)
    worker = start_worker(processes, env)
    send_test = f"{base}/api/v1/brand/{brand_id}/webhook/{endpoint_id}/send-test"
    after_return, after_request = [], []
    for index in range(warmup + samples):
        requested = time.monotonic()
        response = api.post(send_test, headers={"X-Api-Key": api_key}, timeout=10)
        returned = time.monotonic()
        if response.status_code != 202:
            raise RuntimeError(f"send-test answered {response.status_code}: {response.text}")
        delivery_id = response.json()["data"]["deliveryId"]
        # The first pings also wait for the worker to finish starting.
        timeout = 30 if index < warmup else 10
        waited = control.get("/_wait", params={"id": delivery_id, "timeout": timeout})
        if waited.status_code != 200:
            raise RuntimeError(f"{delivery_id} never arrived:\n" + processes.log_of(worker))
        received = waited.json()["at"]
        if index >= warmup:
            after_return.append((received - returned) * 1000)
            after_request.append((received - requested) * 1000)
    p50, p99 = percentile(after_return, 50), percentile(after_return, 99)
    log(
        f"latency, API call returned -> receipt ({samples} samples): p50 {p50:.1f} ms, "
        f"p99 {p99:.1f} ms, max {max(after_return):.1f} ms; from the request start: "
        f"p50 {percentile(after_request, 50):.1f} ms, p99 {percentile(after_request, 99):.1f} ms"
    )
    api.close()
    return p50, p99


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


def compare_tracing(app, processes, env, conn, control, ids, args) -> dict:
    """`--tracing-rounds K`: the worker phase K times with OTLP export off and K times on,
    alternating (off, on, on, off...), each on a fresh backlog of `--deliveries` events, then
    the latency phase once each way. Alternating on one database and one receiver within
    minutes, a spell of load on the shared machine falls on both alike; the ceiling loop,
    single-threaded, moves with load far more than the worker does, so it is no yardstick
    here."""
    brand_id, endpoint_id, api_key, sink_url = ids
    traced_env = {**env, "OTEL_EXPORTER_OTLP_ENDPOINT": sink_url}
    rates: dict[str, list[float]] = {"off": [], "on": []}
    delivered = 0
    for round_number in range(args.tracing_rounds):
        # off, on, on, off...: each round's backlog lands on a fuller database than the last,
        # so neither mode always goes first.
        for mode in ("off", "on") if round_number % 2 == 0 else ("on", "off"):
            publish(app, brand_id, args.deliveries, args.batch)
            log(f"tracing {mode}:")
            rates[mode].append(
                measure_worker(
                    processes,
                    traced_env if mode == "on" else env,
                    conn,
                    control,
                    endpoint_id,
                    args.deliveries,
                    delivered_before=delivered,
                )
            )
            delivered += args.deliveries
    latency = {}
    for mode in ("off", "on"):
        before = {id(process) for _, process, _ in processes.running}
        log(f"tracing {mode}:")
        latency[mode] = measure_latency(
            processes,
            traced_env if mode == "on" else env,
            control,
            brand_id,
            endpoint_id,
            api_key,
            args.samples,
            5,
        )
        for _, process, _ in list(processes.running):
            if id(process) not in before:
                processes.stop(process)
    exported = Control(sink_url).get("/_stats").json()
    log(f"tracing: {exported['exports']} OTLP exports, {exported['bytes']} bytes")
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    return {
        "worker_off_per_s": [round(rate, 1) for rate in rates["off"]],
        "worker_on_per_s": [round(rate, 1) for rate in rates["on"]],
        "on_over_off": round(on / off, 3),
        "latency_off_p50_ms": round(latency["off"][0], 2),
        "latency_off_p99_ms": round(latency["off"][1], 2),
        "latency_on_p50_ms": round(latency["on"][0], 2),
        "latency_on_p99_ms": round(latency["on"][1], 2),
        "otlp_exports": exported["exports"],
    }


class Control:
    """The receiver's control routes, over their own session."""

    def __init__(self, receiver_url: str) -> None:
        import requests

        self.base = receiver_url
        self.session = requests.Session()
        self.session.trust_env = False

    def get(self, path: str, **kwargs):
        return self.session.get(f"{self.base}{path}", timeout=60, **kwargs)


def run(args, workdir: Path, processes: Processes) -> dict:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("BRAND_TEST_BACKENDS", "services")
    import psycopg
    from flask_migrate import upgrade

    from app import create_app
    from extensions import db
    from services.api_keys import create_api_key
    from services.brands import create_brand
    from services.webhook_endpoints import current_url_policy, register_endpoint
    from tests.backends import open_backends

    backends = open_backends()
    try:
        if backends.redis_kind != "server":
            raise RuntimeError("this benchmark needs a Redis server")
        env = app_settings(backends.database_url, backends.redis_url)
        child_env = child_environ(env)
        sink_url = None
        if args.tracing or args.tracing_rounds:
            # The worker and the API export every span to a local sink (CONTRACT 13.6).
            sink_url = start_otlp_sink(processes)
            if args.tracing:
                child_env["OTEL_EXPORTER_OTLP_ENDPOINT"] = sink_url
        receiver_url = start_receiver(processes)
        control = Control(receiver_url)
        app = create_app(env)
        with app.app_context():
            upgrade()
            brand_id = create_brand(name="Bench Foods", plan="growth").id
            endpoint = register_endpoint(
                brand_id=brand_id,
                url=f"{receiver_url}/hooks",
                events=[EVENT_NAME],
                policy=current_url_policy(),
                trace_context=args.tracing or bool(args.tracing_rounds),
            )
            endpoint_id = endpoint.id
            api_key = create_api_key(
                brand_id=brand_id, name="bench", scopes=("read", "write"), created_by="bench"
            ).secret
            db.session.commit()
            db.session.remove()

        conninfo = backends.database_url.replace("postgresql+psycopg://", "postgresql://", 1)
        if args.tracing_rounds:
            with psycopg.connect(conninfo, autocommit=True) as conn:
                ids = (brand_id, endpoint_id, api_key, sink_url)
                result = compare_tracing(app, processes, child_env, conn, control, ids, args)
            processes.stop_all()
            with app.app_context():
                db.engine.dispose()
            return result
        with psycopg.connect(conninfo, autocommit=True) as conn:
            log(f"publishing {args.deliveries} events in batches of {args.batch}")
            took = publish(app, brand_id, args.deliveries, args.batch)
            log(f"published in {took:.1f}s ({args.deliveries / took:.0f} events/s)")
            worker_rate = measure_worker(
                processes, child_env, conn, control, endpoint_id, args.deliveries
            )
            ceiling_rate = measure_ceiling(app, conn, control, receiver_url, endpoint_id)
        p50, p99 = measure_latency(
            processes, child_env, control, brand_id, endpoint_id, api_key, args.samples, 5
        )
        exported = None
        if sink_url is not None:
            exported = Control(sink_url).get("/_stats").json()
            log(f"tracing: {exported['exports']} OTLP exports, {exported['bytes']} bytes")
        processes.stop_all()
        with app.app_context():
            db.engine.dispose()
    finally:
        processes.stop_all()
        backends.close()
    return {
        "worker_per_s": round(worker_rate, 1),
        "ceiling_per_s": round(ceiling_rate, 1),
        "ratio": round(worker_rate / ceiling_rate, 3),
        "latency_p50_ms": round(p50, 2),
        "latency_p99_ms": round(p99, 2),
        "tracing": args.tracing,
        **({"otlp_exports": exported["exports"]} if exported is not None else {}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deliveries", type=int, default=5000)
    parser.add_argument("--batch", type=int, default=100, help="events per publish commit")
    parser.add_argument("--samples", type=int, default=300, help="latency samples")
    parser.add_argument(
        "--tracing",
        action="store_true",
        help="the worker and the API export traces to a local OTLP sink, and the endpoint "
        "takes a traceparent",
    )
    parser.add_argument(
        "--tracing-rounds",
        type=int,
        default=0,
        help="instead of the three measurements: the worker with export off and on, this many "
        "times each, alternating, then the latency each way",
    )
    parser.add_argument("--receiver", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--otlp-sink", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.receiver:
        asyncio.run(_serve_receiver())
        return
    if args.otlp_sink:
        _serve_otlp_sink()
        return

    run_benchmark("bench-deliveries-", lambda workdir, processes: run(args, workdir, processes))


if __name__ == "__main__":
    main()
