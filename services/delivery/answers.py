"""A receiver's answer is untrusted input: any bytes, encoding or compression, as much or as slowly
as it likes. What an attempt keeps of it is made here, bounded and safe to store: the first 2 KiB
of the body as text, at most 32 headers of 256 characters, error texts; control characters and
invalid sequences become U+FFFD. A compressed body is inflated only as far as what is kept (a
gzip bomb inflates 2 KiB), and the body gets `BODY_SECONDS` after the headers: the status is the
answer, the body only what the log shows of it.
"""

from __future__ import annotations

import asyncio
import codecs
import re
import zlib
from collections.abc import Iterable

import aiohttp

from models.webhook_delivery import (
    ERROR_MAX_LENGTH,
    RESPONSE_BODY_MAX_BYTES,
    RESPONSE_HEADER_MAX_CHARS,
    RESPONSE_HEADERS_MAX,
)

# After the answer's headers, how long its body may take (within the attempt's timeout).
BODY_SECONDS = 1.0
# Raw bytes read of a body, at most: what a compressed 2 KiB can take, and then some.
BODY_READ_MAX_BYTES = 64 * 1024
REPLACEMENT = "\ufffd"
# C0 controls but tab, line feed and carriage return; DEL; C1 controls. NUL is what PostgreSQL's
# text refuses; the others have no business in a log a person reads.
_UNPRINTABLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_NAME_UNSAFE = re.compile(r"[^!#$%&'*+\-.^_`|~0-9A-Za-z]")


def safe_text(value: str | bytes, *, limit: int | None = None) -> str:
    """Text that always stores: bytes decoded as UTF-8, invalid sequences, lone surrogates and
    control characters replaced by U+FFFD, cut to `limit` characters."""
    if isinstance(value, bytes):
        text = value.decode("utf-8", errors="replace")
    else:
        # A str may carry lone surrogates (bytes a decoder escaped): not encodable as UTF-8.
        try:
            raw = value.encode("utf-8", errors="surrogateescape")
        except UnicodeEncodeError:
            raw = value.encode("utf-8", errors="replace")
        text = raw.decode("utf-8", errors="replace")
    text = _UNPRINTABLE.sub(REPLACEMENT, text)
    return text if limit is None else text[:limit]


def safe_error(value: str) -> str:
    return safe_text(value, limit=ERROR_MAX_LENGTH)


def kept_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """At most RESPONSE_HEADERS_MAX headers, names made token-safe, values cut to
    RESPONSE_HEADER_MAX_CHARS; a repeated name's values joined as HTTP joins them."""
    kept: dict[str, str] = {}
    for name, value in headers:
        key = _NAME_UNSAFE.sub("_", safe_text(name, limit=RESPONSE_HEADER_MAX_CHARS))
        if key in kept:
            kept[key] = (kept[key] + ", " + safe_text(value))[:RESPONSE_HEADER_MAX_CHARS]
        elif len(kept) < RESPONSE_HEADERS_MAX:
            kept[key] = safe_text(value, limit=RESPONSE_HEADER_MAX_CHARS)
    return kept


class _Inflater:
    """A body's gzip or deflate `Content-Encoding` undone as far as what is kept (another
    encoding is shown as it came)."""

    def __init__(self, encoding: str) -> None:
        encoding = encoding.strip().lower()
        if encoding in ("gzip", "x-gzip"):
            self._inflate: zlib._Decompress | None = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            # zlib-wrapped, as the RFC says; a raw deflate stream is tried if that fails.
            self._inflate = zlib.decompressobj(zlib.MAX_WBITS)
        else:
            self._inflate = None
        self._raw_deflate = encoding == "deflate"
        self.failed = False

    @property
    def active(self) -> bool:
        return self._inflate is not None and not self.failed

    def feed(self, chunk: bytes, room: int) -> bytes:
        """Up to `room` bytes inflated from `chunk` (and what it left over before)."""
        assert self._inflate is not None
        try:
            data = self._inflate.unconsumed_tail + chunk
            return self._inflate.decompress(data, room)
        except zlib.error:
            if self._raw_deflate:
                self._raw_deflate = False
                self._inflate = zlib.decompressobj(-zlib.MAX_WBITS)
                return self.feed(chunk, room)
            self.failed = True
            return b""


async def read_body_start(response: aiohttp.ClientResponse) -> tuple[str, bool]:
    """The body's start (inflated when gzip or deflate) as safe text, and whether the body was
    read to its end (else unread bytes are on the connection)."""
    inflater = _Inflater(response.headers.get("Content-Encoding", ""))
    content = response.content
    if content.is_eof() and not inflater.active:
        # The whole body came with the headers (most answers): no wait, no timer.
        body = content.read_nowait(RESPONSE_BODY_MAX_BYTES)
        return _as_text(body, response), not content.read_nowait(1)
    kept = bytearray()
    read = 0
    complete = False
    try:
        async with asyncio.timeout(BODY_SECONDS):
            while len(kept) < RESPONSE_BODY_MAX_BYTES and read < BODY_READ_MAX_BYTES:
                chunk = await response.content.read(min(16 * 1024, BODY_READ_MAX_BYTES - read))
                if not chunk:
                    complete = True
                    break
                read += len(chunk)
                room = RESPONSE_BODY_MAX_BYTES - len(kept)
                kept += inflater.feed(chunk, room) if inflater.active else chunk[:room]
    except TimeoutError:
        pass
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError):
        # The body was cut short or garbled: its status stands; what came is shown.
        pass
    return _as_text(bytes(kept[:RESPONSE_BODY_MAX_BYTES]), response), complete


def _as_text(body: bytes, response: aiohttp.ClientResponse) -> str:
    """The body in the charset its Content-Type names when Python knows it (UTF-16 included),
    else UTF-8; safe either way."""
    charset = response.charset
    if charset:
        try:
            codecs.lookup(charset)
        except LookupError:
            charset = None
    try:
        text = body.decode(charset or "utf-8", errors="replace")
    except (LookupError, ValueError):
        text = body.decode("utf-8", errors="replace")
    return safe_text(text)
