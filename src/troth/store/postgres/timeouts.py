"""How long a PostgreSQL connection of troth's may go unanswered before it counts as
lost, on both of its ends.

A database that stops or restarts closes its connections: troth sees that at once.
A network that drops packets closes nothing, and without these bounds a connection
waits for TCP's own retransmission timeouts (minutes; idle connections: two hours)
while the node's requests queue behind it.  So every connection troth opens carries
libpq's keepalive options and ``tcp_user_timeout`` (:data:`CLIENT`): an unanswered
connection fails within about :data:`LOST_AFTER` seconds, whether it was sending,
waiting for an answer or idle, and the session reconnects (``session.py``).

The server's end gets the same bounds (:data:`SERVER`, set on each transactional
session after it connects): a node cut off in the middle of a transaction leaves a
backend holding row locks, which other nodes' batches would wait for (a batch's
locked prefetch waits without ``lock_timeout``, ``backend.py``) until the server
noticed — after its own keepalive default of two hours.  With these, the server
ends that backend, and its locks, within seconds.

Each option is added only where the connection string does not set it (an
operator's choice wins); the server's are not set when the string passes
``options`` of its own that name them.  docs/operations.md, "When a node is cut off
from its database", says what each bounds.
"""

from __future__ import annotations

from typing import Any, Final

#: Seconds after which an unanswered connection counts as lost (``tcp_user_timeout``).
LOST_AFTER: Final = 5
#: libpq options added to every connection (strings, as a conninfo holds them).
CLIENT: Final[dict[str, str]] = {
    "connect_timeout": str(LOST_AFTER),
    "keepalives": "1",
    "keepalives_idle": "2",
    "keepalives_interval": "1",
    "keepalives_count": "3",
    "tcp_user_timeout": str(LOST_AFTER * 1000),
}
#: The same bounds on the server's end of a session (one statement, one round trip).
SERVER: Final = (
    "SET tcp_keepalives_idle = 2; SET tcp_keepalives_interval = 1;"
    f" SET tcp_keepalives_count = 3; SET tcp_user_timeout = {LOST_AFTER * 1000}"
)


def with_timeouts(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` (``conninfo_to_dict``'s) with :data:`CLIENT`'s options it lacks."""
    for name, value in CLIENT.items():
        params.setdefault(name, value)
    return params


def server_timeouts(params: dict[str, Any]) -> str | None:
    """:data:`SERVER`, or None when the connection string's ``options`` set any of
    those settings itself."""
    return None if "tcp_" in str(params.get("options", "")) else SERVER
