"""An attempt over HTTPS connects to the checked address yet speaks TLS to the receiver's name:
SNI carries the name and the certificate is verified against it (no DNS rebinding, no
certificate check bypassed). A real TLS server on 127.0.0.1 with a certificate from a test CA."""

from __future__ import annotations

import asyncio
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from services.delivery.transport import Transport
from services.endpoint_urls import UrlPolicy
from tests.certificates import TestCa

LOCAL = UrlPolicy(https_only=False, allow_local=True)


@pytest.fixture(scope="module")
def test_ca(tmp_path_factory):
    ca = TestCa(tmp_path_factory.mktemp("tls"))
    return ca.ca_file, ca.issue


class _Ok(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.hosts.append(self.headers.get("Host"))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


@pytest.fixture
def tls_receiver(test_ca):
    """Start an HTTPS server on 127.0.0.1 presenting a certificate for `dns_name`."""
    servers = []

    def start(dns_name: str):
        _, issue = test_ca
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(issue(dns_name))
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
        server.sni_names, server.hosts = [], []
        context.sni_callback = lambda sock, name, ctx: server.sni_names.append(name)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def attempt(url: str, ca_file=None) -> object:
    """One attempt through the engine's transport, trusting `ca_file` (else the system's trust
    store, which does not know the test CA)."""
    context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)

    async def send():
        transport = Transport(policy=LOCAL, timeout=5, ssl_context=context)
        try:
            return await transport.send_attempt(
                url=url,
                secret="whsec_test",
                body=b"{}",
                event_name="webhook.test",
                event_id="evt_test",
                delivery_id="whd_test",
            )
        finally:
            await transport.close()

    return asyncio.run(send())


def test_https_attempt_sends_the_name_and_verifies_its_certificate(test_ca, tls_receiver):
    ca_file, _ = test_ca
    server = tls_receiver("localhost")
    outcome = attempt(f"https://localhost:{server.server_address[1]}/hooks", ca_file)
    assert outcome.error is None and outcome.http_status == 200
    assert server.sni_names == ["localhost"]
    assert server.hosts == [f"localhost:{server.server_address[1]}"]


def test_a_certificate_for_another_name_fails_the_attempt(test_ca, tls_receiver):
    ca_file, _ = test_ca
    server = tls_receiver("receiver.example")
    outcome = attempt(f"https://localhost:{server.server_address[1]}/hooks", ca_file)
    assert outcome.http_status is None
    assert outcome.error == "TLS error: the receiver's certificate is not for its host name"
    assert server.hosts == []  # nothing was posted


def test_an_untrusted_certificate_fails_the_attempt(tls_receiver):
    server = tls_receiver("localhost")
    outcome = attempt(f"https://localhost:{server.server_address[1]}/hooks")
    assert outcome.error == "TLS error: the receiver's certificate could not be verified"
