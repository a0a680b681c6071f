"""``/docs`` (Swagger UI) and ``/redoc`` served with local assets: the service runs on
air-gapped clusters, where FastAPI's defaults (scripts, styles and fonts from CDNs) give a
blank page. The assets are the copies packaged by ``fastapi-offline`` (PyPI, MIT), a
dependency; only its static files are used, the pages are FastAPI's own."""

from __future__ import annotations

import functools
from importlib import resources

from fastapi import FastAPI, HTTPException
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse, Response

from app.security_headers import CSP, html_policy

ASSETS_PREFIX = "/docs-assets"
#: asset file -> media type; nothing else is served from the package
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "redoc.standalone.js": "text/javascript; charset=utf-8",
    "favicon.png": "image/png",
}


@functools.cache
def _asset(name: str) -> bytes:
    return (resources.files("fastapi_offline") / "static" / name).read_bytes()


def _serve(app: FastAPI, path: str, page: HTMLResponse) -> None:
    """GET ``path`` answers ``page`` (built once: it depends on nothing of the request), with
    a Content-Security-Policy allowing its own inline parts only."""
    html = bytes(page.body).decode()
    headers = {CSP: html_policy(html)}

    async def documentation_page() -> HTMLResponse:
        return HTMLResponse(html, headers=headers)

    app.add_api_route(path, documentation_page, methods=["GET"], include_in_schema=False)


def install(app: FastAPI) -> None:
    """Routes for the two documentation pages and their assets (the app is built with
    ``docs_url=None, redoc_url=None``)."""
    openapi_url = app.openapi_url or "/openapi.json"
    favicon = f"{ASSETS_PREFIX}/favicon.png"
    swagger_ui = get_swagger_ui_html(
        openapi_url=openapi_url,
        title=f"{app.title} - Swagger UI",
        oauth2_redirect_url="/docs/oauth2-redirect",
        swagger_js_url=f"{ASSETS_PREFIX}/swagger-ui-bundle.js",
        swagger_css_url=f"{ASSETS_PREFIX}/swagger-ui.css",
        swagger_favicon_url=favicon,
    )
    redoc = get_redoc_html(
        openapi_url=openapi_url,
        title=f"{app.title} - ReDoc",
        redoc_js_url=f"{ASSETS_PREFIX}/redoc.standalone.js",
        redoc_favicon_url=favicon,
        with_google_fonts=False,
    )
    _serve(app, "/docs", swagger_ui)
    _serve(app, "/docs/oauth2-redirect", get_swagger_ui_oauth2_redirect_html())
    _serve(app, "/redoc", redoc)

    @app.get(ASSETS_PREFIX + "/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        media_type = ASSETS.get(name)
        if media_type is None:
            raise HTTPException(404, f"no documentation asset {name!r}")
        return Response(
            _asset(name), media_type=media_type, headers={"cache-control": "max-age=86400"}
        )
