"""An attempt as a command a developer can run again (CONTRACT 12.5): curl posting the same body
with the same headers to the endpoint's URL, at the address the attempt connected to.

Every argument is shell-quoted (POSIX shells), so a body or header holding quotes, `$` or
newlines reaches curl as it was sent. The body is given with `--data-raw`: it is sent as is
(`--data-binary` would read a file for a body starting with `@`). curl's own default headers
that the attempt did not send are removed (`-H 'Name:'`), and HTTP/1.1 is asked for, as the
worker speaks it.
"""

from __future__ import annotations

import ipaddress
import shlex
from urllib.parse import urlsplit

from services.endpoint_urls import default_port

# Headers curl adds by itself to a POST of data; one the attempt did not send is removed.
# (Content-Length is not among them: curl computes it from the body, as the worker did.)
_CURL_OWN_HEADERS = ("User-Agent", "Accept", "Content-Type", "Expect")
_CONTINUATION = " \\\n  "


def sent_to_url(url: str, request_headers: dict[str, str]) -> bool:
    """Whether the attempt's `Host` header names this URL's host and port: false once the
    endpoint's URL has moved to another host since the attempt (its path is not recorded)."""
    host = _header(request_headers, "Host")
    return host is None or host.lower() == urlsplit(url).netloc.rsplit("@", 1)[-1].lower()


def curl_command(
    *, url: str, remote_address: str | None, request_headers: dict[str, str], body: str
) -> str:
    """A curl command line that posts `body` with exactly `request_headers` to `url`, connecting
    to `remote_address` (`--resolve`) when the attempt connected to one for this URL's host."""
    lines = [f"curl --include --http1.1 -X POST {shlex.quote(url)}"]
    same_host = sent_to_url(url, request_headers)
    resolve = _resolve(url, remote_address) if same_host else None
    if resolve is not None:
        lines.append(f"--resolve {shlex.quote(resolve)}")
    for name, value in request_headers.items():
        if name.lower() == "host" and not same_host:
            continue  # the old host's name, to another host: curl names the URL's
        # curl reads `Name:` as "remove it"; `Name;` sends it empty.
        header = f"{name}: {value}" if value else f"{name};"
        lines.append(f"-H {shlex.quote(header)}")
    sent = {name.lower() for name in request_headers}
    lines += [
        f"-H {shlex.quote(f'{name}:')}" for name in _CURL_OWN_HEADERS if name.lower() not in sent
    ]
    lines.append(f"--data-raw {shlex.quote(body)}")
    return _CONTINUATION.join(lines)


def _resolve(url: str, remote_address: str | None) -> str | None:
    """curl's `--resolve host:port:address`, or None when there is nothing to pin: no address
    recorded, or an address literal in the URL already."""
    if remote_address is None:
        return None
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return None
    address = ipaddress.ip_address(remote_address)
    literal = f"[{address}]" if address.version == 6 else str(address)
    return f"{host}:{parts.port or default_port(parts.scheme)}:{literal}"


def _header(headers: dict[str, str], name: str) -> str | None:
    return next((v for k, v in headers.items() if k.lower() == name.lower()), None)
