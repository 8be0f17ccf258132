"""The dashboard's static assets and templates keep to the Content-Security-Policy: htmx is
the vendored, pinned file, and no template carries inline script, style or event handlers."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HTMX = ROOT / "static" / "vendor" / "htmx-2.0.11.min.js"
HTMX_SHA256 = "d6fdc75f204e6bdefa99b69bf1e6d4ac69b8a364f77929f45c13476b4000f717"


def test_vendored_htmx_is_the_recorded_release():
    assert hashlib.sha256(HTMX.read_bytes()).hexdigest() == HTMX_SHA256
    assert HTMX_SHA256 in (ROOT / "static" / "vendor" / "README.md").read_text()
    assert b'version:"2.0.11"' in HTMX.read_bytes()


def test_layout_loads_only_the_apps_own_scripts(client):
    page = client.get("/dashboard/sign-in")
    html = page.get_data(as_text=True)
    scripts = re.findall(r"<script[^>]*>", html)
    assert scripts == [
        '<script src="/static/vendor/htmx-2.0.11.min.js" defer>',
        '<script src="/static/dashboard.js" defer>',
    ]
    assert client.get("/static/vendor/htmx-2.0.11.min.js").status_code == 200
    assert client.get("/static/dashboard.js").status_code == 200
    assert client.get("/static/dashboard.css").status_code == 200


def test_no_template_needs_unsafe_inline():
    inline_script = re.compile(r"<script(?![^>]*\bsrc=)[^>]*>", re.IGNORECASE)
    handler = re.compile(r"\son[a-z]+\s*=", re.IGNORECASE)
    for template in (ROOT / "templates").rglob("*.html"):
        text = template.read_text()
        assert not inline_script.search(text), template
        assert "style=" not in text, template
        assert "<style" not in text, template
        assert not handler.search(text), template
        assert "hx-on" not in text, template
        assert "javascript:" not in text, template


def test_every_page_names_an_icon_and_the_browsers_default_path_serves_one(client):
    icon = client.get("/favicon.ico")
    assert icon.status_code == 200
    assert icon.mimetype == "image/vnd.microsoft.icon"
    assert icon.data[:4] == b"\x00\x00\x01\x00"  # an ICO file
    assert icon.data.count(b"\x89PNG") == 3  # 16, 32 and 48 px
    for path in ("/dashboard/sign-in", "/docs", "/no-such-page"):
        html = client.get(path, headers={"Accept": "text/html"}).get_data(as_text=True)
        assert '<link rel="icon" href="/favicon.ico"' in html, path
        assert '<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">' in html, path
