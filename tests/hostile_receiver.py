"""A receiver that answers as an attacker or a broken server would, in a process of its own: each
path is one kind of hostile answer (`ANSWERS`). Run as `python -m tests.hostile_receiver PORT`;
it prints `listening PORT` when it accepts connections and counts the requests per path, which
`GET /_counts` returns as JSON.

Used by tests/test_hostile_receivers.py and bench/chaos.py: every other endpoint's deliveries
must arrive on time beside these, each of these attempts must be recorded, and the worker's
memory must stay bounded.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import sys
import zlib
from collections import Counter

BOMB_BYTES = 256 * 1024 * 1024  # what the gzip body inflates to
HEADER_FLOOD = 300  # headers of 8 KiB each
DRIP_SECONDS = 0.5

counts: Counter[str] = Counter()


def _gzip_bomb() -> bytes:
    """256 MiB of zeros, gzip-compressed (about 250 KiB), made once."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = bytes(1024 * 1024)
    parts = [compressor.compress(chunk) for _ in range(BOMB_BYTES // len(chunk))]
    parts.append(compressor.flush())
    return b"".join(parts)


_BOMB = _gzip_bomb()


def _response(status: str, body: bytes, headers: tuple[str, ...] = ()) -> bytes:
    head = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


ANSWERS = {
    # 200 with a body no text column takes as it is.
    "/nul": lambda: _response("200 OK", b"OK\x00\x00\x00 and a NUL-terminated tail\x00"),
    "/utf16": lambda: _response(
        "200 OK",
        "OK, received".encode("utf-16"),
        ("Content-Type: text/plain; charset=utf-16",),
    ),
    "/binary": lambda: _response(
        "200 OK", bytes(range(256)) * 16 + b"\xff\xfe\x00\xc3\x28", ("Content-Type: image/png",)
    ),
    "/gzip-bomb": lambda: _response("200 OK", _BOMB, ("Content-Encoding: gzip",)),
    "/not-http": lambda: b"\x00\x01\x02 this is not HTTP at all \xff\xfe\r\n\r\n\x00" * 64,
    "/header-flood": lambda: _response(
        "200 OK",
        b"ok",
        tuple(f"X-Flood-{n}: " + "x" * 8000 for n in range(HEADER_FLOOD)),
    ),
    # Within the limits, but more and longer headers than a record keeps.
    "/many-headers": lambda: _response(
        "200 OK", b"ok", tuple(f"X-Many-{n}: " + "y" * 300 for n in range(100))
    ),
    # The headers at once, then the body a byte every half second.
    "/drip": None,
    # A reason phrase and a header value with NUL and invalid UTF-8.
    "/dirty-headers": lambda: (
        b"HTTP/1.1 200 OK\x00\xc3\x28\r\nContent-Length: 2\r\nX-Dirty: a\x00b\xff\r\n\r\nok"
    ),
    "/gzip-small": lambda: _response(
        "200 OK", gzip.compress(b"compressed fine " * 10), ("Content-Encoding: gzip",)
    ),
}


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, bytes] | None:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    _, path, _ = lines[0].split(" ", 2)
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    body = await reader.readexactly(length) if length else b""
    return path, body


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            try:
                request = await _read_request(reader)
            except (asyncio.IncompleteReadError, ConnectionError, ValueError):
                return
            if request is None:
                return
            path, _ = request
            if path == "/_counts":
                body = json.dumps(counts).encode()
                writer.write(_response("200 OK", body, ("Content-Type: application/json",)))
                await writer.drain()
                continue
            counts[path] += 1
            if path == "/drip":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4096\r\n\r\n")
                await writer.drain()
                for _ in range(4096):
                    writer.write(b"x")
                    await writer.drain()
                    await asyncio.sleep(DRIP_SECONDS)
                continue
            answer = ANSWERS.get(path)
            if answer is None:
                writer.write(_response("200 OK", b"ok"))
                await writer.drain()
                continue
            writer.write(answer())
            await writer.drain()
            if path == "/not-http":
                return  # and close
    except (ConnectionError, asyncio.CancelledError):
        return
    finally:
        writer.close()


async def main(port: int) -> None:
    server = await asyncio.start_server(_serve, "127.0.0.1", port, limit=1 << 20)
    print(f"listening {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 0))
