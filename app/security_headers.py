"""Security headers on every answer, and the Content-Security-Policy of the HTML pages.

The HTML pages (``/``, ``/docs``, ``/redoc``) load nothing from outside the service (their
scripts and styles are served by it: ``app/docs_ui.py``), so their policy allows only this
origin, plus their own inline scripts by hash (CSP Level 3, ``'sha256-...'``): an injected
script does not run. Every other answer (JSON, SVG, text) gets a policy that runs nothing
(``default-src 'none'``; an SVG opened on its own may still use its inline styles). All answers
carry ``X-Content-Type-Options: nosniff`` and refuse framing (``X-Frame-Options: DENY`` and
``frame-ancestors 'none'``: clickjacking).
"""

from __future__ import annotations

import base64
import hashlib
import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

CSP = "content-security-policy"
#: everything but the HTML pages: nothing runs, nothing loads, no framing
DEFAULT_POLICY = "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'"
#: sent with every answer
ALWAYS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
)

_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)


def html_policy(page: str) -> str:
    """The policy of one HTML page: this origin only, its inline scripts by hash."""
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(body.encode()).digest()).decode() + "'"
        for body in _INLINE_SCRIPT.findall(page)
    )
    scripts = f"'self' {hashes}".strip()
    return (
        "default-src 'self'; "
        f"script-src {scripts}; "
        # matplotlib's SVG pictures carry <style> elements; ReDoc and Swagger UI set styles
        "style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; "
        # ReDoc runs its search index in a worker made from a blob
        "worker-src 'self' blob:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    )


class SecurityHeadersMiddleware:
    """Add :data:`ALWAYS` to every answer, and :data:`DEFAULT_POLICY` unless it has a CSP."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {key.lower() for key, _ in headers}
                headers += [(k, v) for k, v in ALWAYS if k not in names]
                if CSP.encode() not in names:
                    headers.append((CSP.encode(), DEFAULT_POLICY.encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)
