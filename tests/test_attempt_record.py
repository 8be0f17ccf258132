"""The whole attempt on record (CONTRACT 12.5, issue 37 item 6): a real `flask worker` delivers to
real receivers over http and https, and fetchWebhookDelivery says where each attempt's time
went, which address it reached and what both sides' headers were; the delivery page draws it
and gives a curl command that, run for real, sends the receiver the same bytes and headers.

The module's one worker trusts the test CA (SSL_CERT_FILE), so it serves the http and the https
tests alike: workers share the queue, and one that did not trust the CA would fail an https
attempt it claimed.
"""

from __future__ import annotations

import html
import re
import ssl
import subprocess
from collections.abc import Iterator

import pytest

from blueprints.dashboard.attempts import timing_segments
from extensions import db
from services.attempt_replay import curl_command, sent_to_url
from services.events import publish_event
from tests.certificates import TestCa
from tests.dashboard import sign_in
from tests.helpers import assert_success
from tests.receiver import Receiver, Reply
from tests.test_webhook_delivery import Api
from tests.worker_process import WorkerProcess

# Quotes, `$`, backticks, a backslash, a newline and non-ASCII: what a shell would mangle
# unless every argument is quoted.
AWKWARD = 'it\'s "$(echo pwned)" `id` $HOME \\ \n \u2013 ünï 🚚'
DEAL = {"id": "deal_7", "status": "completed", "note": AWKWARD}
SLOW = 0.3


@pytest.fixture(scope="module")
def test_ca(tmp_path_factory) -> TestCa:
    return TestCa(tmp_path_factory.mktemp("attempts-tls"))


@pytest.fixture(scope="module")
def trusting_worker(app, app_environ, test_ca) -> Iterator[WorkerProcess]:
    worker = WorkerProcess({**app_environ, "SSL_CERT_FILE": str(test_ca.ca_file)})
    yield worker
    worker.stop()


@pytest.fixture
def tls_receiver(test_ca) -> Iterator[Receiver]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(test_ca.issue("localhost"))
    server = Receiver(tls=context)
    yield server
    server.close()


@pytest.fixture
def api(client, brand, write_key) -> Api:
    return Api(client, brand, write_key)


def deliver(app, api: Api, brand: str, url: str, receiver: Receiver, worker) -> dict:
    """Register `url`, publish one deal.completed event, and wait until it is delivered; the
    delivery as fetchWebhookDelivery shows it."""
    endpoint = api.register(url, events=["deal.completed"])
    receiver.secrets = [endpoint["signingSecret"]]
    with app.app_context():
        published = publish_event(brand_id=brand, name="deal.completed", data=DEAL)
        [delivery_id] = published.delivery_ids
        db.session.commit()
    return api.wait_delivery(delivery_id, "delivered", worker=worker)


def curl_from_page(client, delivery_id: str, attempt: int = 1) -> str:
    """The curl command as the delivery page shows it (and its copy button copies)."""
    page = client.get(f"/dashboard/deliveries/{delivery_id}").get_data(as_text=True)
    found = re.search(
        rf'<pre class="block" id="attempt-{attempt}-curl"><code>(.*?)</code></pre>', page, re.S
    )
    assert found, page
    return html.unescape(found.group(1))


def run_curl(command: str, **environ: str) -> subprocess.CompletedProcess:
    """The command as a person pasting it into a POSIX shell runs it."""
    return subprocess.run(
        ["sh", "-c", command],
        capture_output=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", **environ},
        check=False,
    )


def test_an_http_attempt_records_its_address_timings_and_both_sides_headers(
    app, api, brand, receiver, trusting_worker
):
    answer_headers = {"Retry-After": "120", "X-Proxy": "edge-7", "Set-Cookie": "a=b"}
    receiver.reply_with(Reply(delay=SLOW, headers=answer_headers, body=b'{"ok":true}'))

    detail = deliver(app, api, brand, receiver.url, receiver, trusting_worker)

    [received] = receiver.wait_for(1)
    [attempt] = detail["attempts"]
    assert attempt["remoteAddress"] == "127.0.0.1"
    timings = attempt["timings"]
    assert set(timings) == {"dnsMs", "connectMs", "tlsMs", "firstByteMs"}
    assert timings["tlsMs"] is None  # http: no handshake
    assert timings["dnsMs"] is None  # an address in the URL: no lookup
    assert isinstance(timings["connectMs"], int) and timings["connectMs"] >= 0
    assert timings["firstByteMs"] >= SLOW * 1000  # the receiver's delay, and then some
    assert attempt["durationMs"] >= timings["firstByteMs"] + timings["connectMs"]
    # The headers as sent: what the receiver got, name for name and value for value.
    sent = attempt["requestHeaders"]
    assert sent == received.headers
    for name in (
        "X-Service-Timestamp",
        "X-Service-Signature",
        "X-Service-Event",
        "X-Service-Delivery",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
        "Host",
        "Content-Length",
    ):
        assert name in sent, name
    assert sent["Content-Length"] == str(len(received.body))
    # The answer's headers, as the receiver sent them.
    answered = attempt["responseHeaders"]
    assert {name: answered[name] for name in answer_headers} == answer_headers
    assert answered["Content-Length"] == "11"


def test_an_https_attempt_records_its_tls_handshake(app, api, brand, tls_receiver, trusting_worker):
    detail = deliver(app, api, brand, tls_receiver.url, tls_receiver, trusting_worker)

    [received] = tls_receiver.wait_for(1)
    [attempt] = detail["attempts"]
    assert attempt["remoteAddress"] == "127.0.0.1"
    timings = attempt["timings"]
    assert isinstance(timings["tlsMs"], int) and timings["tlsMs"] >= 0
    assert isinstance(timings["connectMs"], int)
    assert isinstance(timings["firstByteMs"], int)
    assert attempt["requestHeaders"]["Host"] == f"localhost:{tls_receiver.port}"
    assert attempt["requestHeaders"] == received.headers


def test_the_openapi_document_states_the_attempt_record(client):
    document = client.get("/api/v1/openapi.json").get_json()
    schemas = document["components"]["schemas"]
    attempt = schemas["Attempt"]["properties"]
    for name in ("remoteAddress", "requestHeaders", "responseHeaders", "timings"):
        assert name in attempt, name
    assert attempt["remoteAddress"]["type"] == ["string", "null"]
    timings = schemas["AttemptTimings"]["properties"]
    assert set(timings) == {"dnsMs", "connectMs", "tlsMs", "firstByteMs"}
    assert all(timings[name]["type"] == ["integer", "null"] for name in timings)


def test_a_read_key_reads_the_record_and_no_signing_secret_is_in_it(
    app, client, brand, write_key, read_key, receiver, trusting_worker
):
    detail = deliver(
        app, Api(client, brand, write_key), brand, receiver.url, receiver, trusting_worker
    )
    read = assert_success(
        client.get(
            f"/api/v1/brand/{brand}/webhook/deliveries/{detail['id']}",
            headers={"X-Api-Key": read_key},
        )
    )
    assert read["attempts"][0]["timings"] == detail["attempts"][0]["timings"]
    assert receiver.secrets[0] not in str(read)


def test_the_curl_command_sends_the_same_bytes_and_headers_again(
    app, api, client, brand, read_key, receiver, trusting_worker
):
    # By name, so the command must pin the address the attempt connected to.
    url = f"http://localhost:{receiver.port}/hooks?source=brand-api&x='1'"
    detail = deliver(app, api, brand, url, receiver, trusting_worker)
    sign_in(client, read_key)
    command = curl_from_page(client, detail["id"])
    assert f"--resolve localhost:{receiver.port}:127.0.0.1" in command

    ran = run_curl(command)

    assert ran.returncode == 0, ran.stderr.decode()
    assert ran.stdout.startswith(b"HTTP/1.1 200")  # --include: the answer, status first
    original, again = receiver.wait_for(2)
    assert again.body == original.body  # the very bytes
    assert again.json["data"]["note"] == AWKWARD
    assert again.headers == original.headers  # every header, nothing added or lost
    assert again.path == original.path == "/hooks?source=brand-api&x='1'"
    assert again.signature_valid  # signed as the attempt was: a receiver accepts it


def test_the_curl_command_of_an_https_attempt_reaches_the_same_receiver(
    app, api, client, brand, read_key, tls_receiver, trusting_worker, test_ca
):
    detail = deliver(app, api, brand, tls_receiver.url, tls_receiver, trusting_worker)
    sign_in(client, read_key)
    command = curl_from_page(client, detail["id"])

    ran = run_curl(command, CURL_CA_BUNDLE=str(test_ca.ca_file))

    assert ran.returncode == 0, ran.stderr.decode()
    original, again = tls_receiver.wait_for(2)
    assert again.body == original.body
    assert again.headers == original.headers


def test_the_delivery_page_draws_the_timing_bar_and_the_answer_headers(
    app, api, client, brand, read_key, receiver, trusting_worker
):
    receiver.reply_with(Reply(delay=SLOW, headers={"X-Proxy": "<edge-7>"}))
    detail = deliver(app, api, brand, receiver.url, receiver, trusting_worker)
    [attempt] = detail["attempts"]
    sign_in(client, read_key)

    page = client.get(f"/dashboard/deliveries/{detail['id']}").get_data(as_text=True)

    article = re.search(r'<article class="attempt" id="attempt-1">.*?</article>', page, re.S)
    text = article.group(0)
    assert "Connected to <code>127.0.0.1</code>" in text
    bar = re.search(r'<div class="timing-bar" aria-hidden="true">(.*?)</div>', text, re.S)
    widths = re.findall(r"timing-(\w+) w-tens-(\d+) w-units-(\d)", bar.group(1))
    shares = {key: int(tens) * 10 + int(units) for key, tens, units in widths}
    assert sum(shares.values()) == 100
    assert shares["wait"] >= 60  # 300 ms of the attempt's few hundred went waiting
    assert "tls" not in shares  # none over http
    # Each figure is there as text, for a reader and a screen reader alike.
    first_byte = attempt["timings"]["firstByteMs"]
    assert f"<dt>{_swatch('wait')}Waiting for the first byte</dt><dd>{first_byte} ms</dd>" in text
    assert f'<dt>{_swatch("tls")}TLS handshake</dt><dd><span class="muted">none over http' in text
    assert "none needed" in text  # no DNS lookup for an address
    # The answer's headers, collapsed, escaped.
    assert '<summary>Response headers <span class="muted">(' in text
    assert "X-Proxy: &lt;edge-7&gt;" in text
    # The curl command, server-side, and its copy button (shown by the script).
    assert '<pre class="block" id="attempt-1-curl"><code>curl --include --http1.1' in text
    button = re.search(r'<button [^>]*data-copy-from="attempt-1-curl"[^>]*>Copy as curl<', text)
    assert button and re.search(r"\shidden>", button.group()), text
    # Beside it, when the signature it carries goes stale (tests/test_dashboard_browser_round_four).
    assert 'id="attempt-1-stale"' in text


def _swatch(key: str) -> str:
    return f'<span class="timing-swatch timing-{key}" aria-hidden="true"></span>'


# ---- the command and the bar, from records no worker makes ----------------------------------

SENT = {"Host": "hooks.example.com", "Content-Type": "application/json", "X-Empty": ""}


def test_the_command_pins_an_ipv6_address_and_removes_curls_own_headers():
    command = curl_command(
        url="https://hooks.example.com/in",
        remote_address="2001:db8::7",
        request_headers=SENT,
        body="{}",
    )
    assert "--resolve 'hooks.example.com:443:[2001:db8::7]'" in command
    # curl's defaults the attempt did not send are removed; an empty value is sent empty.
    assert "-H User-Agent: \\\n  -H Accept: \\\n  -H Expect:" in command
    assert "-H 'X-Empty;'" in command
    assert command.endswith("--data-raw '{}'")


def test_the_command_to_an_address_or_a_moved_url_pins_nothing():
    literal = curl_command(
        url="http://127.0.0.1:8080/in",
        remote_address="127.0.0.1",
        request_headers={"Host": "127.0.0.1:8080"},
        body="{}",
    )
    assert "--resolve" not in literal
    moved = curl_command(
        url="https://new.example.com/in",
        remote_address="203.0.113.7",
        request_headers=SENT,
        body="{}",
    )
    # The old host's address and name would reach the old receiver, or confuse the new one.
    assert "--resolve" not in moved and "Host:" not in moved
    assert sent_to_url("https://HOOKS.example.com/other", SENT)
    assert not sent_to_url("https://new.example.com/in", SENT)


def _attempt(duration: int, error: str | None = None, address="127.0.0.1", **timings) -> dict:
    names = ("dnsMs", "connectMs", "tlsMs", "firstByteMs")
    return {
        "durationMs": duration,
        "error": error,
        "remoteAddress": address,
        "timings": {name: timings.get(name) for name in names},
    }


def test_the_bars_shares_add_up_and_a_step_that_took_time_shows():
    segments = timing_segments(_attempt(1000, dnsMs=2, connectMs=3, tlsMs=5, firstByteMs=985))
    shares = {segment.key: segment.percent for segment in segments}
    assert sum(shares.values()) == 100
    assert shares["dns"] == 1 and shares["connect"] == 1 and shares["tls"] == 1
    assert shares["rest"] == 1  # 5 ms left over
    assert [segment.width_classes for segment in segments][3] == "w-tens-9 w-units-6"


def test_missing_figures_say_why():
    reused = {s.key: s for s in timing_segments(_attempt(50, firstByteMs=45))}
    assert reused["connect"].note == reused["tls"].note == "a kept-alive connection was reused"
    refused = {s.key: s for s in timing_segments(_attempt(3, "Connection refused", connectMs=None))}
    assert refused["dns"].note == "none needed"
    assert refused["connect"].note == "no figure: see the error"
    assert refused["wait"].note == "no answer came"
    assert refused["rest"].label == "The rest, no answer" and refused["rest"].ms == 3
    unresolved = {s.key: s for s in timing_segments(_attempt(9, "Could not resolve", None))}
    assert unresolved["dns"].note == "no figure: see the error"
    # An attempt recorded before the figures were kept: no error, no figures.
    older = {s.key: s for s in timing_segments(_attempt(120, address=None))}
    assert older["connect"].note == "not recorded"
    assert older["rest"].percent == 100
