"""The access log: one line and one count per answered request, whichever ingress
answered it (HTTP ``POST /``, its httptools path, NATS).

What counts and logs an answer is chosen once, when the app is built
(:func:`answered_by`), so that the plain format's request path does no more than
format its line; the JSON format's line carries the request's ids and the node
(``server/logs.py``), and a hook may wrap either (tracing adds a span).
"""

from __future__ import annotations

import logging
import time

from troth.machine.core import request_ids
from troth.server.ingress.envelope import Answer, Answered, Hooks
from troth.server.logs import FIELDS, access_fields
from troth.server.metrics import Metrics

access = logging.getLogger("troth.access")


class AccessLog:
    """Counts and logs answered requests for one node."""

    def __init__(self, metrics: Metrics, node: str) -> None:
        self.metrics = metrics
        self.node = node

    def plain(self, answer: Answer, started: float, via: str = "") -> None:
        """Count and log one answered request (``via``: `` via=nats``, or nothing):
        what answers are counted with unless the JSON log format is on."""
        seconds = time.perf_counter() - started
        kind, corr, status = answer[0], answer[1], answer[2]
        self.metrics.request(kind, status, seconds)
        access.info("%s corrId=%s status=%d ms=%.2f%s", kind, corr, status, seconds * 1000, via)

    def json(self, answer: Answer, started: float, via: str = "") -> None:
        """:meth:`plain` with the access line's fields for the JSON format
        (``server/logs.py``): the request's ids, the node."""
        seconds = time.perf_counter() - started
        kind, corr, status, _, admitted = answer
        self.metrics.request(kind, status, seconds)
        if access.isEnabledFor(logging.INFO):
            ids = () if admitted is None else request_ids(admitted.req)
            fields = access_fields(kind, corr, ids, status, seconds, self.node, via)
            access.info(
                "%s corrId=%s status=%d ms=%.2f%s",
                kind,
                corr,
                status,
                seconds * 1000,
                via,
                extra={FIELDS: fields},
            )

    def client_gone(self, started: float) -> None:
        """A ``POST /`` whose client left before its body arrived: logged, not counted."""
        seconds = time.perf_counter() - started
        access.info(
            "unknown corrId=0 status=499 ms=%.2f (client gone before its body)",
            seconds * 1000,
            extra={FIELDS: access_fields("unknown", "0", (), 499, seconds, self.node, "")},
        )


def answered_by(log: AccessLog, log_format: str, hooks: Hooks | None) -> Answered:
    """What counts and logs one answered request, chosen once: the plain or the JSON
    line, wrapped by the hooks' (tracing's span) when there are hooks."""
    answered: Answered = log.json if log_format == "json" else log.plain
    return answered if hooks is None else hooks.answered(answered)
