"""Structured JSON logs carrying the request id of the request being served.

The request id comes from the client's ``X-Request-ID`` when it is a sane token (echoed back),
else a fresh one; it lives in a context variable so every log line of that request has it.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
import time
import uuid
from typing import Any

REQUEST_ID_HEADER = "X-Request-ID"
#: accept client ids that are safe to echo into a header and a log line
_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")

request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
#: time.perf_counter() when the current request arrived: deadlines count from there
request_started_var: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "request_started", default=None
)

# attributes every LogRecord has; anything else was passed via ``extra=`` and is logged
_STANDARD_ATTRS = frozenset(
    vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None)).keys()
) | {"message", "asctime", "taskName"}


def request_id_from(header_value: str | None) -> str:
    """The client's id if acceptable, else a new random one."""
    if header_value is not None and _REQUEST_ID_RE.match(header_value):
        return header_value
    return uuid.uuid4().hex


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": request_id_var.get(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        base = super().format(record)
        return f"{base} [request_id={request_id_var.get()}]"


def configure(level: str = "INFO", json_lines: bool = True) -> None:
    """Route the ``kperf`` and ``uvicorn`` loggers to one stderr handler."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter()
        if json_lines
        else _TextFormatter("%(asctime)s %(levelname)s %(name)s %(message)s")
    )
    for name in ("kperf", "uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(level)
        logger.propagate = False
    # the access log is ours (one line per request with its id); silence uvicorn's
    logging.getLogger("uvicorn.access").disabled = True
