"""Request bodies read strictly, and decoded off the event loop: the route class every JSON
router uses.

Strict: a body must be declared JSON (``application/json`` or ``+json``; a form or text body is
a 415, not a 422 about its fields), in UTF-8 (RFC 8259 §8.1: a declared ``charset`` other than
UTF-8 is a 415, undecodable bytes a 400), well formed (a 422 giving line and column) and with
each key at most once per object (RFC 8259 §4 leaves duplicates to the parser; the usual one
keeps the last, so ``"device": "nope", "device": "rtx-a6000"`` would be answered for a device
the client may not have meant: a 422 naming the key).

Off the loop: FastAPI decodes a JSON body on the event loop. A 2 MB PTX module takes about
8 ms to decode (its newlines are escapes), so ten such requests arriving together held the
loop for 80 ms and /healthz waited behind them. Bodies above :data:`OFF_LOOP_ABOVE_BYTES` are
decoded in one dedicated thread instead: one at a time, so between two decodes the loop always
gets its turn (the decoder holds the GIL for a whole body; several decoding threads would pass
it among themselves while the loop waits).

The request object handed to FastAPI is this route's own, so the body bytes it caches are
released when the endpoint returns, not held while a large answer is still being sent.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import sys
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from email.message import Message
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from app.errors import BodyDecodeError

#: bodies up to this size are decoded on the loop (a thread hop costs more than they do)
OFF_LOOP_ABOVE_BYTES = 64 * 1024

_decoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kperf-json")


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document = dict(pairs)
    if len(document) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return document


class _Pairs(list[tuple[str, Any]]):
    """An object kept as its key/value pairs (duplicates included), to find a duplicate's path."""


def _duplicate_path(node: Any, path: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    """The dotted path of the first key given twice in one object, depth first."""
    if isinstance(node, _Pairs):
        seen: set[str] = set()
        for key, _value in node:
            if key in seen:
                return (*path, key)
            seen.add(key)
        for key, value in node:
            found = _duplicate_path(value, (*path, key))
            if found is not None:
                return found
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found = _duplicate_path(value, (*path, str(index)))
            if found is not None:
                return found
    return None


def decode_json_body(body: bytes) -> Any:
    """The JSON document of a request body, or :class:`BodyDecodeError` saying what is wrong."""
    try:
        text = body.decode("utf-8-sig")  # a UTF-8 byte order mark is tolerated (RFC 8259 §8.1)
    except UnicodeDecodeError as exc:
        raise BodyDecodeError(
            400, "body", f"the body is not UTF-8: invalid byte at offset {exc.start}"
        ) from None
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        # the error path only: parse again keeping every pair to name where the key is
        path = _duplicate_path(json.loads(text, object_pairs_hook=_Pairs))
        field = ".".join(path) if path else exc.key
        raise BodyDecodeError(
            422, field, f"key {exc.key!r} given twice in one object; give each key once"
        ) from None
    except json.JSONDecodeError as exc:
        raise BodyDecodeError(
            422,
            "body",
            f"malformed JSON at line {exc.lineno}, column {exc.colno} "
            f"(character {exc.pos}): {exc.msg}",
        ) from None
    except RecursionError:
        raise BodyDecodeError(400, "body", "JSON nested too deeply") from None
    except ValueError:
        # the one ValueError besides JSONDecodeError: an integer literal past Python's
        # conversion limit, malformed input like any other (422), not an unreadable body
        raise BodyDecodeError(
            422,
            "body",
            f"an integer literal has more than {sys.get_int_max_str_digits()} digits; "
            "no field takes a number that large",
        ) from None


def check_json_media_type(content_type: str | None) -> None:
    """Refuse (415) a body declared as anything but JSON in UTF-8; no header means JSON."""
    if content_type is None:
        return
    message = Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    if message.get_content_maintype() != "application" or not (
        subtype == "json" or subtype.endswith("+json")
    ):
        raise BodyDecodeError(
            415,
            "content-type",
            f"media type {message.get_content_type()!r} is not accepted; send the body as "
            "application/json",
        )
    charset = message.get_param("charset")
    if isinstance(charset, str):
        try:
            name = codecs.lookup(charset).name
        except LookupError:
            name = charset.lower()
        if name != "utf-8":
            raise BodyDecodeError(
                415,
                "content-type",
                f"charset {charset!r} is not accepted: JSON is exchanged in UTF-8 "
                "(RFC 8259 §8.1); send UTF-8 and declare charset=utf-8 or none",
            )


class OffLoopJSONRequest(Request):
    async def json(self) -> Any:
        body = await self.body()
        if len(body) <= OFF_LOOP_ABOVE_BYTES:
            return decode_json_body(body)
        # not cached on the request (FastAPI asks once): the decoded document is the
        # validated model's to keep, or nobody's
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(_decoder, decode_json_body, body)


class OffLoopJSONRoute(APIRoute):
    """An :class:`APIRoute` whose endpoint sees an :class:`OffLoopJSONRequest`, and whose
    body, if it takes one, must be JSON."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        takes_body = self.body_field is not None

        async def route_handler(request: Request) -> Response:
            if takes_body:
                check_json_media_type(request.headers.get("content-type"))
            return await handler(OffLoopJSONRequest(request.scope, request.receive))

        return route_handler
