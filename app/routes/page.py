"""GET /: the explorer page (plain server-rendered HTML; its script calls the public API)."""

from __future__ import annotations

import functools
import html
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from app.security_headers import CSP, html_policy
from app.service import ServiceDep
from device_profiles import DeviceProfile

router = APIRouter(tags=["page"])

#: the placeholders of app/page/index.html, replaced by <option> lists
GEMM_WS_DEVICES = "<!--GEMM_WS_DEVICES-->"
MANY_BSP_DEVICES = "<!--MANY_BSP_DEVICES-->"
#: the device the form proposes first (the GeMM-WS paper's)
PREFERRED_DEVICE = "rtx-a6000"


@functools.cache
def _template() -> str:
    return (resources.files("app") / "page" / "index.html").read_text(encoding="utf-8")


def _options(profiles: list[DeviceProfile]) -> str:
    ordered = sorted(profiles, key=lambda p: (p.id != PREFERRED_DEVICE, p.id))
    return "".join(
        f'<option value="{html.escape(p.id)}">{html.escape(p.id)} — {html.escape(p.name)}</option>'
        for p in ordered
    )


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
def page(service: ServiceDep) -> HTMLResponse:
    """The explorer: optimize form, shortlist and timeline; PTX breakdown in a second tab."""
    profiles = list(service.profiles.values())
    text = _template().replace(
        GEMM_WS_DEVICES, _options([p for p in profiles if "gemm-ws" in p.models_served()])
    )
    text = text.replace(
        MANY_BSP_DEVICES, _options([p for p in profiles if "many-bsp" in p.models_served()])
    )
    return HTMLResponse(text, headers={CSP: html_policy(text)})
