"""One log format for every line the process prints: troth's, uvicorn's, the
libraries'.

``log_format = plain`` (the default) is the line people read,
``2026-12-04 03:14:54,668 INFO troth.access promise.get corrId=… status=200 ms=2.03``;
``json`` is one JSON object a line for a log shipper (Loki, Elasticsearch, …):
``{"time", "level", "logger", "message"}`` and, on an access line, the request's
``corrId``, ``kind``, ``ids``, ``status``, ``ms`` and ``node`` as fields of their own
(:func:`access_fields`), ``traceId`` and ``spanId`` when tracing is on.

Both go through one handler on the root logger; uvicorn is started without a
logging configuration of its own (``log_config=None``), so its loggers
(``uvicorn.error``: "Started server process", "Uvicorn running on …") propagate to
that handler and print in the same format.

The access line is on the request path.  The plain format costs what it always
cost: the app logs it exactly as before, and nothing here runs per request except
the standard formatter.  The JSON format's extra fields are computed only when it is
chosen (``server/ingress/access.py``: the app picks its access logger once, at construction).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import IO, Any

import msgspec

#: The plain line: unchanged since the first release (people and scripts read it).
PLAIN = "%(asctime)s %(levelname)s %(name)s %(message)s"
FORMATS = ("plain", "json")
#: Libraries whose info and debug lines can hold a secret (an URL's key, headers).
QUIET = ("httpx", "httpcore")
#: Attribute of a :class:`logging.LogRecord` that carries an access line's fields.
FIELDS = "troth_fields"

_encode = msgspec.json.Encoder().encode
#: The current span's ``(traceId, spanId)``, or None outside a span.
TraceIds = Callable[[], tuple[str, str] | None]


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ``time`` (RFC 3339, UTC, milliseconds), ``level``,
    ``logger``, ``message``; ``traceId`` and ``spanId`` when ``trace_ids`` (tracing
    on: ``server/tracing.current_ids``) names a span; the fields an access line
    carries; ``exception`` (the traceback as text) when the record has one.

    The formatter is given its source of trace ids when logging is configured, not
    told later by tracing: whoever configures the process's logging knows whether
    tracing is on, and a formatter made without it never asks."""

    def __init__(self, trace_ids: TraceIds | None = None) -> None:
        super().__init__()
        self.trace_ids = trace_ids

    def format(self, record: logging.LogRecord) -> str:
        seconds = int(record.created)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
        out: dict[str, Any] = {
            "time": f"{stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        trace_ids = self.trace_ids
        if trace_ids is not None and (ids := trace_ids()) is not None:
            out["traceId"], out["spanId"] = ids
        fields = getattr(record, FIELDS, None)
        if fields:
            out.update(fields)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = record.stack_info
        return _encode(out).decode()


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler writing to whatever ``sys.stderr`` is when a line is written, not
    the stream it was when the handler was made: a process (or a test run) that
    swaps stderr after logging is configured keeps its lines instead of writing
    them to a closed file."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> IO[str]:
        return sys.stderr

    @stream.setter
    def stream(self, value: IO[str]) -> None:
        """Ignored: the stream is always the current ``sys.stderr``."""


def formatter(log_format: str, trace_ids: TraceIds | None = None) -> logging.Formatter:
    """The formatter of ``log_format``; ``trace_ids`` is read by the JSON one only
    (the plain line is unchanged since the first release)."""
    if log_format == "json":
        return JsonFormatter(trace_ids)
    return logging.Formatter(PLAIN)


def configure(
    level: str,
    log_format: str,
    stream: IO[str] | None = None,
    *,
    trace_ids: TraceIds | None = None,
) -> logging.Handler:
    """Install the one handler (on stderr) every logger of the process writes
    through, replacing any the root logger had; uvicorn's loggers keep no handler of
    their own and propagate to it.  ``trace_ids``: the current span's ids, for JSON
    lines (tracing on)."""
    handler: logging.Handler = StderrHandler() if stream is None else logging.StreamHandler(stream)
    handler.setFormatter(formatter(log_format, trace_ids))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi"):
        named = logging.getLogger(name)
        named.handlers.clear()
        named.propagate = True
    # httpx logs every push's URL at info (a webhook's key in its query with it) and
    # httpcore, at debug, the headers of the answer: neither reaches the log.
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.captureWarnings(True)  # Python's warnings too, in the one format
    return handler


def access_fields(
    kind: str,
    corr: str,
    ids: tuple[str, ...],
    status: int,
    seconds: float,
    node: str,
    via: str,
) -> dict[str, object]:
    """An access line's fields, for the JSON format.  ``via`` is what the plain line
    appends (`` via=nats origin=…``, or nothing): its ``key=value`` words become
    fields too."""
    fields: dict[str, object] = {
        "corrId": corr,
        "kind": kind,
        "ids": list(ids),
        "status": status,
        "ms": round(seconds * 1000, 2),
        "node": node,
    }
    for word in via.split():
        key, _, value = word.partition("=")
        fields[key] = value
    return fields


class Throttled:
    """At most one warning a second per reason; the rest are counted into the next."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self.last: dict[str, float] = {}
        self.quiet: dict[str, int] = {}

    def warning(self, reason: str, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self.last.get(reason, -2.0) < 1.0:
            self.quiet[reason] = self.quiet.get(reason, 0) + 1
            return
        self.last[reason] = now
        suppressed = self.quiet.pop(reason, 0)
        if suppressed:
            message += f" (and {suppressed} more in the last second)"
        self.logger.warning(message, *args)
