"""The caller of a route, as a dependency: ``ReaderDep`` on every asking route (a token only
when the server requires one for reads), ``WriterDep`` on every route that stores or deletes
(app/auth.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request

from app.auth import Principal, Role, caller


def _needs(role: Role) -> Callable[[Request], Awaitable[Principal]]:
    async def principal(request: Request) -> Principal:
        tokens = request.app.state.service.tokens
        return caller(tokens, request.headers.get("authorization"), role)

    return principal


read_access = _needs("read")
ReaderDep = Annotated[Principal, Depends(read_access)]
WriterDep = Annotated[Principal, Depends(_needs("write"))]
