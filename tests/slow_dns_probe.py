"""Run by tests/test_delivery_faults.py inside `unshare -rn` (a network namespace of its own,
where it may add addresses): 20 healthy names and 8 whose DNS answers after 6 s, all sent at
once through the delivery loop's real `Transport`. Prints one JSON line of outcomes.

The names resolve (through a DNS server of this namespace on 127.0.0.1:53) to 11.0.0.1, a
public address that exists only here, where an HTTPS receiver with a test CA's certificate
answers: the address check, the lookup and TLS are the production ones."""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from dnslib import QTYPE, RR, A
from dnslib.server import BaseResolver, DNSServer

from services.delivery.transport import Transport
from services.endpoint_urls import UrlPolicy
from tests.certificates import TestCa

ADDRESS = "11.0.0.1"
SLOW_SECONDS = 6.0


class Resolver(BaseResolver):
    def resolve(self, request, handler):
        name = str(request.q.qname).rstrip(".")
        if name.endswith(".slow.test"):
            time.sleep(SLOW_SECONDS)
        reply = request.reply()
        if request.q.qtype == QTYPE.A:
            reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A(ADDRESS), ttl=1))
        return reply


class Ok(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


def certificates(workdir: Path) -> tuple[Path, Path]:
    ca = TestCa(workdir)
    return ca.ca_file, ca.issue("*.healthy.test", "*.slow.test")


async def send_all(ca_file: Path, port: int) -> dict:
    transport = Transport(
        policy=UrlPolicy(https_only=True, allow_local=False),
        timeout=10,
        ssl_context=ssl.create_default_context(cafile=str(ca_file)),
        nameservers=["127.0.0.1"],
    )

    async def one(name: str) -> dict:
        started = time.monotonic()
        outcome = await transport.send_attempt(
            url=f"https://{name}:{port}/hooks",
            secret="whsec_test",
            body=b"{}",
            event_name="deal.completed",
            event_id=f"evt_{name}",
            delivery_id=f"whd_{name}",
        )
        return {
            "name": name,
            "status": outcome.http_status,
            "error": outcome.error,
            "seconds": time.monotonic() - started,
        }

    try:
        slow = [one(f"r{n}.slow.test") for n in range(8)]
        healthy = [one(f"r{n}.healthy.test") for n in range(20)]
        results = await asyncio.gather(*slow, *healthy)
    finally:
        await transport.close()
    return {"slow": results[:8], "healthy": results[8:]}


def main(workdir: Path) -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    subprocess.run(["ip", "addr", "add", f"{ADDRESS}/32", "dev", "lo"], check=True)
    ca_file, cert_file = certificates(workdir)
    server = ThreadingHTTPServer((ADDRESS, 0), Ok)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    dns = DNSServer(Resolver(), port=53, address="127.0.0.1")
    dns.start_thread()
    print(json.dumps(asyncio.run(send_all(ca_file, server.server_address[1]))))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
