#!/usr/bin/env python3
"""Webhooks on a laptop: follow a brand's events through the events API and forward each one to
a local URL, as a delivery would arrive, with no public URL and no tunnel.

    python3 scripts/listen.py --api https://api.example.com --brand brd_… --key svc_live_… \\
        --forward-to http://localhost:8000/hooks [--events conversion.recorded,deal.completed]

A single file, standard library only (Python 3.9+): copy it anywhere, or run it from a checkout.

- It long-polls `GET /api/v1/brand/{brand}/event/fetch-events` and POSTs each event to
  `--forward-to` with the body and headers of a real delivery (CONTRACT 6.1 and 8.1):
  `X-Service-Timestamp`, `X-Service-Signature`, `X-Service-Event`, `X-Service-Delivery` and
  the Standard Webhooks `webhook-id`, `webhook-timestamp`, `webhook-signature`, signed as the
  service signs (CONTRACT 12.1). The secret is a local one: printed at start, kept in the state
  file, or given with `--secret` (or `LISTEN_SECRET`). One it makes is `whsec_` + base64 of 32
  random bytes, so a Standard Webhooks library verifies with it as printed (`Webhook(secret)`);
  an older one (any other `whsec_…`) signs as before, `webhook-signature` keyed with the whole
  string. `webhook-id` and `X-Service-Delivery` carry the event id: the relay makes one
  delivery of each event.
- One line per event: time, type, event id, your receiver's status and how long it took.
- The cursor (the last event forwarded) is saved after each event in a small state file
  (`--state`; default under ~/.local/state/brand-api-listen/), so after Ctrl-C, a crash, or the
  API or network going away it resumes where it stopped: no event lost, none forwarded twice.
  The first run starts with events published from then on; `--after EVENT_ID` starts after
  that event instead (to replay).
- Only a 2xx answer delivers an event, as for a real delivery. Any other answer (a 400 from a
  receiver whose WEBHOOK_SECRET is not this relay's secret, a 500, a redirect, a timeout) is
  shown on the event's line and the event is sent again with back-off (1 s doubling to 30 s),
  the events after it held until it is delivered. A receiver that is not listening yet
  (connection refused) is waited for, the event kept.
- The API not answering, answering 5xx, or something that is not the API answering (a 404
  page of another server on that port, a proxy's error) is waited out the same way, each line
  saying what came back; only the API's own refusal (a wrong key, an unknown event name) stops
  it, with the reason (exit status 2).
- Ctrl-C (or SIGTERM) stops it cleanly, after the event being forwarded, if any.

The API key can be given as `BRAND_API_KEY` instead of `--key`, which keeps it out of your shell
history and the process list.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import datetime
import hashlib
import hmac
import json
import os
import re
import secrets
import signal
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

API_VERSION = "1"  # the `apiVersion` of every event body (services/events.py)
USER_AGENT = "BrandAPI-Webhooks/1 (listen)"
WAIT_SECONDS = 25  # the long-poll; the API allows up to 30
PAGE_LIMIT = 100
FORWARD_TIMEOUT = 10.0
RETRY_MAX_SECONDS = 30.0
ANSWER_READ_LIMIT = 65536  # bytes of an error answer read, to say what it was
GLIMPSE_CHARACTERS = 80  # of an answer that is not the API's, shown in the relay's line
SECRET_PREFIX = "whsec_"  # noqa: S105 - a prefix, not a secret
SIGNING_KEY_BYTES = 32
BASE64_KEY_LENGTH = 44  # padded base64 of 32 bytes; older secrets are base62 of another length


class Stop(Exception):
    """Ctrl-C or SIGTERM: stop now (nothing is half-done when this is raised)."""


class Fatal(Exception):
    """Something to fix before running again (a wrong key, an unknown event name)."""


class ApiUnavailable(Exception):
    """The API could not be reached, answered 5xx, or something else answered in its place:
    try again later, from the same cursor. args: (what happened, seconds asked to wait)."""


# ---- signing: exactly as services/signing.py signs a delivery ----


def sign(secret: str, timestamp: int, raw_body: bytes) -> str:
    mac = hmac.new(secret.encode(), b"%d." % timestamp + raw_body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def standard_signing_key(secret: str) -> bytes:
    """The key of `webhook-signature`: the 32 bytes a `whsec_` + base64 secret encodes, as the
    Standard Webhooks libraries decode it; any other secret's whole string, as it always was."""
    encoded = secret[len(SECRET_PREFIX) :]
    if secret.startswith(SECRET_PREFIX) and len(encoded) == BASE64_KEY_LENGTH:
        try:
            key = base64.b64decode(encoded, validate=True)
        except binascii.Error:
            key = b""
        if len(key) == SIGNING_KEY_BYTES and base64.b64encode(key).decode() == encoded:
            return key
    return secret.encode()


def sign_standard(secret: str, message_id: str, timestamp: int, raw_body: bytes) -> str:
    message = message_id.encode() + b".%d." % timestamp + raw_body
    mac = hmac.new(standard_signing_key(secret), message, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def delivery_headers(secret: str, event: dict, raw_body: bytes, timestamp: int) -> dict:
    delivery_id = event["id"]
    return {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "X-Service-Timestamp": str(timestamp),
        "X-Service-Signature": sign(secret, timestamp, raw_body),
        "X-Service-Event": event["type"],
        "X-Service-Delivery": delivery_id,
        "webhook-id": delivery_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign_standard(secret, delivery_id, timestamp, raw_body),
    }


def delivery_body(event: dict, brand_id: str) -> bytes:
    """The body a delivery of the event sends, byte for byte: the events API gives its `id`,
    `type`, `createdAt`, `subject`, `sequence` and `data`; the brand and the API version
    complete it."""
    body = {
        "id": event["id"],
        "type": event["type"],
        "createdAt": event["createdAt"],
        "brandId": brand_id,
        "apiVersion": API_VERSION,
        "subject": event["subject"],
        "sequence": event["sequence"],
        "data": event["data"],
    }
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SIGNING_KEY_BYTES)).decode()


# ---- the state file ----


def default_state_path(api: str, brand_id: str, forward_to: str) -> Path:
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    digest = hashlib.sha256(f"{api}\n{brand_id}\n{forward_to}".encode()).hexdigest()[:12]
    return base / "brand-api-listen" / f"{brand_id}-{digest}.json"


class State:
    """`{"after": cursor, "secret": ...}` in a file only its owner reads, replaced whole at each
    save (a crash mid-save leaves the previous one)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.values: dict = {}
        if path.exists():
            try:
                self.values = json.loads(path.read_text())
            except ValueError as error:
                raise Fatal(f"{path} is not a state file of this script ({error})") from None

    @property
    def exists(self) -> bool:
        return "after" in self.values

    def save(self, **values) -> None:
        self.values.update(values)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".listen-")
        try:
            os.fchmod(handle, 0o600)  # it holds the local signing secret
            with os.fdopen(handle, "w") as file:
                json.dump(self.values, file)
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise


# ---- the events API ----


class Api:
    def __init__(self, base: str, brand_id: str, key: str, types: str | None) -> None:
        base = base.rstrip("/")
        base = base[: -len("/api/v1")] if base.endswith("/api/v1") else base
        self.base = base
        self.url = f"{base}/api/v1/brand/{urllib.parse.quote(brand_id)}/event/fetch-events"
        self.key = key
        self.types = types
        # The environment's proxies apply, as for any HTTP client; a long-poll needs no cache.
        self.opener = urllib.request.build_opener()

    def events(self, after: str | None, wait: int, limit: int = PAGE_LIMIT) -> dict:
        """One answer of fetch-events: `{"events": [...], "meta": {...}}`."""
        query = {"limit": str(limit), "wait": str(wait)}
        if after:
            query["after"] = after
        if self.types:
            query["types"] = self.types
        request = urllib.request.Request(  # noqa: S310 - http(s) only (parse_arguments)
            f"{self.url}?{urllib.parse.urlencode(query)}",
            headers={"X-Api-Key": self.key, "Accept": "application/json"},
        )
        try:
            with self.opener.open(request, timeout=wait + 15) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as error:
            status, raw = error.code, _read_some(error)
            if status == 429:
                retry_after = _seconds(error.headers.get("Retry-After"))
                raise ApiUnavailable("the API is rate limiting this key", retry_after) from None
        except (OSError, ValueError) as error:  # refused, reset, timed out
            raise ApiUnavailable(f"the API is unreachable ({_describe(error)})") from None
        answer = _envelope(raw)
        if status >= 500:
            said = f": {answer['message']}" if answer else _glimpse(raw)
            raise ApiUnavailable(f"the API is unreachable (HTTP {status}{said})")
        if answer is None:
            # Not the API: another server on that port, a proxy, a captive portal. It may be
            # the API again later (a restart, a deploy), so it is waited out, not fatal.
            raise ApiUnavailable(
                f"{self.base} answered HTTP {status}, not as the Brand API does{_glimpse(raw)}; "
                "is --api right?"
            )
        if not 200 <= status < 300:
            details = answer.get("errors")
            raise Fatal(
                f"the API refused: HTTP {status} {answer.get('message')}"
                + (f" {json.dumps(details)}" if details else "")
            )
        return {"events": answer["data"]["events"], "meta": answer["meta"]}


def _read_some(error: urllib.error.HTTPError) -> bytes:
    try:
        return error.read(ANSWER_READ_LIMIT)
    except OSError:
        return b""


def _envelope(raw: bytes) -> dict | None:
    """The API's answer (CONTRACT's envelope), or None when the bytes are not one."""
    try:
        answer = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(answer, dict) or "requestId" not in answer:
        return None
    if not isinstance(answer.get("statusCode"), int) or not isinstance(answer.get("message"), str):
        return None
    if 200 <= answer["statusCode"] < 300 and not (
        isinstance(answer.get("data"), dict)
        and isinstance(answer["data"].get("events"), list)
        and isinstance(answer.get("meta"), dict)
    ):
        return None
    return answer


def _glimpse(raw: bytes) -> str:
    """`: '<the first words of an answer>'`, printable text only (no markup, no terminal
    escapes), for a line saying what came back."""
    text = raw[:ANSWER_READ_LIMIT].decode("utf-8", "replace")
    text = re.sub(r"<[^>]*>|\x1b\[[0-?]*[ -/]*[@-~]|\x1b.?", " ", text)  # markup, escapes
    text = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    if not text:
        return " (an empty body)"
    if len(text) > GLIMPSE_CHARACTERS:
        text = text[:GLIMPSE_CHARACTERS] + "…"
    return f": {text!r}"


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None


def _describe(error: BaseException) -> str:
    if isinstance(error, urllib.error.URLError) and error.reason is not None:
        error = error.reason if isinstance(error.reason, BaseException) else error
    if isinstance(error, (socket.timeout, TimeoutError)):
        return "timed out"
    return getattr(error, "strerror", None) or str(error) or type(error).__name__


# ---- forwarding ----


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A delivery follows no redirect (CONTRACT 6.2: a 3xx fails), nor does the relay."""

    def redirect_request(self, *args, **kwargs):
        return None


def delivered(status: str) -> bool:
    """Whether the receiver's answer delivers the event: a 2xx, as for a real delivery."""
    return status.isdigit() and 200 <= int(status) < 300


def forward(url: str, body: bytes, headers: dict) -> tuple[str, float]:
    """POST once: (what the receiver answered: its status, or `error: …`; milliseconds).
    ConnectionRefusedError when nothing listens there."""
    request = urllib.request.Request(  # noqa: S310 - http(s) only (parse_arguments)
        url, data=body, headers=headers, method="POST"
    )
    # Local: no proxy. No redirect followed.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirects())
    started = time.monotonic()
    try:
        with opener.open(request, timeout=FORWARD_TIMEOUT) as response:
            response.read()
            status = str(response.status)
    except urllib.error.HTTPError as error:
        status = str(error.code)
    except urllib.error.URLError as error:
        if isinstance(error.reason, ConnectionRefusedError):
            raise error.reason from None
        status = f"error: {_describe(error)}"
    except OSError as error:
        if isinstance(error, ConnectionRefusedError):
            raise
        status = f"error: {_describe(error)}"
    return status, (time.monotonic() - started) * 1000


class Relay:
    def __init__(self, arguments: argparse.Namespace, api: Api, state: State) -> None:
        self.arguments = arguments
        self.api = api
        self.state = state
        self.secret: str = state.values["secret"]
        self.after: str | None = state.values.get("after")
        # While an event is being forwarded and saved, a stop signal only asks: the loop stops
        # once that event is recorded, so it is neither lost nor forwarded twice.
        self.busy = False
        self.stop_asked = False

    def on_stop_signal(self, _signum, _frame) -> None:
        if self.busy:
            self.stop_asked = True
        else:
            raise Stop

    def run(self) -> None:
        pause = 1.0
        waiting_since: float | None = None
        while True:
            try:
                answer = self.api.events(self.after, WAIT_SECONDS)
            except ApiUnavailable as problem:
                reason, retry_after = (*problem.args, None)[:2]
                delay = retry_after or pause
                if waiting_since is None:
                    waiting_since = time.monotonic()
                say(f"{_now()}  {reason}; trying again in {delay:.0f} s")
                time.sleep(delay)
                pause = min(pause * 2, RETRY_MAX_SECONDS)
                continue
            if waiting_since is not None:
                say(f"{_now()}  the API answers again; resuming after {self.after or 'the start'}")
                waiting_since = None
            pause = 1.0
            if answer["meta"].get("cursorExpired"):
                say(
                    f"{_now()}  {self.after} is older than the API keeps: events between it and "
                    "the oldest kept one were deleted unseen; going on from the oldest kept"
                )
            for event in answer["events"]:
                self.deliver(event)
            if not answer["events"] and answer["meta"].get("cursorExpired"):
                self.save(None)  # an expired cursor is the oldest kept event: start there

    def deliver(self, event: dict) -> None:
        """Forward the event until the receiver takes it (a 2xx), then move the cursor past it."""
        self.busy = True
        try:
            body = delivery_body(event, self.arguments.brand)
            self._forward_until_delivered(event, body)
            self.save(event["id"])
        finally:
            self.busy = False
        if self.stop_asked:
            raise Stop

    def _forward_until_delivered(self, event: dict, body: bytes) -> None:
        told = False
        pause = 1.0
        while True:
            headers = delivery_headers(self.secret, event, body, int(time.time()))
            try:
                status, milliseconds = forward(self.arguments.forward_to, body, headers)
            except ConnectionRefusedError:
                if not told:
                    say(
                        f"{_now()}  nothing listens at {self.arguments.forward_to} yet; "
                        f"holding {event['id']} until something does"
                    )
                    told = True
                self._wait(1.0)
                continue
            line = (
                f"{_now()}  {event['type']:<28} {event['id']}  -> {status} ({milliseconds:.0f} ms)"
            )
            if delivered(status):
                say(line)
                return
            hint = ""
            if status in ("400", "401", "403") and pause == 1.0:
                hint = " (a receiver checking signatures needs the signing secret printed above)"
            say(f"{line}; not delivered, trying again in {pause:.0f} s{hint}")
            self._wait(pause)
            pause = min(pause * 2, RETRY_MAX_SECONDS)

    def _wait(self, seconds: float) -> None:
        """Sleep with nothing in flight: Ctrl-C may stop it here (the event is sent again on
        the next run)."""
        self.busy = False
        try:
            if self.stop_asked:
                raise Stop
            time.sleep(seconds)
        finally:
            self.busy = True

    def save(self, after: str | None) -> None:
        self.after = after
        self.state.save(after=after)


def skip_to_the_end(api: Api) -> tuple[str | None, int]:
    """The newest event's id (None: the brand has none kept) and how many were skipped."""
    after, skipped = None, 0
    while True:
        answer = api.events(after, wait=0)
        skipped += len(answer["events"])
        after = answer["meta"]["nextAfter"]
        if len(answer["events"]) < PAGE_LIMIT:
            return after, skipped


def _until_reachable(call):
    """`call()`, tried again with back-off while the API cannot be reached."""
    pause = 1.0
    while True:
        try:
            return call()
        except ApiUnavailable as problem:
            reason, retry_after = (*problem.args, None)[:2]
            delay = retry_after or pause
            say(f"{_now()}  {reason}; trying again in {delay:.0f} s")
            time.sleep(delay)
            pause = min(pause * 2, RETRY_MAX_SECONDS)


def say(line: str) -> None:
    print(line, flush=True)


def _now() -> str:
    return datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")


def parse_arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Forward a brand's events to a local URL, signed as deliveries are.",
        epilog="Stop with Ctrl-C; run it again to resume where it stopped.",
    )
    parser.add_argument("--api", required=True, help="the service's base URL")
    parser.add_argument("--brand", required=True, help="the brand id (brd_…)")
    parser.add_argument(
        "--key", default=os.environ.get("BRAND_API_KEY"), help="an API key (or BRAND_API_KEY)"
    )
    parser.add_argument("--forward-to", required=True, help="your receiver's URL")
    parser.add_argument("--events", help="only these event names, comma-separated")
    parser.add_argument(
        "--secret",
        default=os.environ.get("LISTEN_SECRET"),
        help="the whsec_… secret to sign with (or LISTEN_SECRET); default: one made on the "
        "first run and kept in the state file",
    )
    parser.add_argument("--state", type=Path, help="the state file (cursor and secret)")
    parser.add_argument(
        "--after", help="start after this event id (replay), whatever the state file says"
    )
    arguments = parser.parse_args(argv)
    if not arguments.key:
        parser.error("give an API key with --key or BRAND_API_KEY")
    for option, url in (("--api", arguments.api), ("--forward-to", arguments.forward_to)):
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            parser.error(f"{option} must be an http:// or https:// URL")
    if arguments.secret is not None and not arguments.secret.startswith(SECRET_PREFIX):
        parser.error(f"--secret must start with {SECRET_PREFIX}")
    return arguments


def main(argv: list[str]) -> int:
    arguments = parse_arguments(argv)
    api = Api(arguments.api, arguments.brand, arguments.key, arguments.events)
    path = arguments.state or default_state_path(
        arguments.api, arguments.brand, arguments.forward_to
    )
    relay: Relay | None = None
    try:
        state = State(path)
        secret = arguments.secret or state.values.get("secret") or new_secret()
        if arguments.after:
            state.save(after=arguments.after, secret=secret)
            start = f"after {arguments.after}"
        elif state.exists:
            state.save(secret=secret)
            start = f"after {state.values['after'] or 'the start'} (from {path})"
        else:
            newest, skipped = _until_reachable(lambda: skip_to_the_end(api))
            state.save(after=newest, secret=secret)
            start = f"with new events ({skipped} earlier ones skipped; --after EVENT_ID replays)"
        relay = Relay(arguments, api, state)
        signal.signal(signal.SIGINT, relay.on_stop_signal)
        signal.signal(signal.SIGTERM, relay.on_stop_signal)
        say(f"Signing secret: {secret}  (give it to your receiver; --secret sets one)")
        say(
            f"Ready: listening on {arguments.brand}'s events"
            + (f" ({arguments.events})" if arguments.events else "")
            + f", forwarding to {arguments.forward_to}, starting {start}. Ctrl-C stops."
        )
        relay.run()
    except (Stop, KeyboardInterrupt):
        if relay is None:
            say("Stopped before forwarding anything.")
        else:
            say(f"Stopped. The next run resumes after {relay.after or 'the start'} ({path}).")
        return 0
    except Fatal as problem:
        say(f"listen: {problem}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
