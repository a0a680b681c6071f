"""The caller of a route, as a dependency: ``ReaderDep`` on every asking route (a token only
when the server requires one for reads), ``WriterDep`` on every route that stores or deletes
(app/auth.py); ``ReadCall``/``WriteCall`` bundle the caller with the service and ``Accept``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, Request

from app.auth import Principal, Role, caller
from app.routes.json_body import OffLoopJSONRoute
from app.service import Service, ServiceDep


def _needs(role: Role) -> Callable[[Request], Awaitable[Principal]]:
    async def principal(request: Request) -> Principal:
        tokens = request.app.state.service.tokens
        return caller(tokens, request.headers.get("authorization"), role)

    return principal


read_access = _needs("read")
ReaderDep = Annotated[Principal, Depends(read_access)]
WriterDep = Annotated[Principal, Depends(_needs("write"))]


@dataclass(frozen=True, slots=True)
class Call:
    """What a route needs besides its body and path: the service, who asks, what it accepts."""

    service: Service
    principal: Principal
    #: the request's ``Accept`` header, None when it has none
    accept: str | None


async def _reading(service: ServiceDep, principal: ReaderDep, request: Request) -> Call:
    return Call(service, principal, request.headers.get("accept"))


async def _writing(service: ServiceDep, principal: WriterDep, request: Request) -> Call:
    return Call(service, principal, request.headers.get("accept"))


ReadCall = Annotated[Call, Depends(_reading)]
WriteCall = Annotated[Call, Depends(_writing)]


def reading_router(tag: str, prefix: str = "") -> APIRouter:
    """A router of JSON routes that every reader may call (with a token where reads need one)."""
    return APIRouter(
        prefix=prefix,
        tags=[tag],
        route_class=OffLoopJSONRoute,
        dependencies=[Depends(read_access)],
    )
