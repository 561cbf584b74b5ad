"""How ``troth serve`` starts: its port taken before anything else, and one line
and an exit code of its own for each way a start can fail.

Binding first means a port already in use stops the start at once, with one line
and its own exit code, before a store is opened or a line claims the server is
listening.  The sockets are made as asyncio's ``create_server`` would make them
for ``host`` (one per address the name resolves to, IPv6 sockets IPv6-only,
``SO_REUSEADDR``), so that binding them here changes nothing else.
"""

from __future__ import annotations

import socket
import sqlite3
import sys

from troth.server.config import Settings
from troth.store.faults import StoreUnavailable
from troth.store.sql.migrate import SchemaError

#: Exit codes of ``troth serve`` and ``troth dev`` (README, "Exit codes of troth serve").
EXIT_OK = 0
#: An unexpected error: the server logged it with its traceback.
EXIT_FAILED = 1
#: A setting that cannot be used: a bad value, a key or certificate that cannot be read.
EXIT_CONFIG = 2
#: The address cannot be listened on: the port is in use, not permitted, no such host.
EXIT_LISTEN = 3
#: The store cannot be opened: an unreachable database, a file that cannot be created.
EXIT_STORE = 4
#: Stopped with Ctrl-C (128 + SIGINT, as a shell reports it).
EXIT_INTERRUPTED = 130

#: Connections the kernel queues before the server accepts them (uvicorn's default).
BACKLOG = 2048


def where(host: str, port: int) -> str:
    """``host:port`` as a person writes it (``[::1]:8001`` for an IPv6 address)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def reason(exc: OSError) -> str:
    """The system's words for a failure, as the middle of a sentence."""
    text = exc.strerror or str(exc)
    return text[:1].lower() + text[1:]


def cannot_listen(host: str, port: int, exc: OSError) -> str:
    return f"cannot listen on {where(host, port)}: {reason(exc)}"


def cannot_open_store(settings: Settings, exc: BaseException) -> str:
    """One line for a store that cannot be opened; never the PostgreSQL URL itself,
    which may hold a password."""
    detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if settings.store == "postgres":
        return f"cannot open the PostgreSQL store (postgres_url): {detail}"
    return f"cannot open the SQLite store {settings.db}: {detail}"


def store_errors() -> tuple[type[BaseException], ...]:
    """What opening a store raises when the store, not troth, is at fault."""
    errors: list[type[BaseException]] = [OSError, sqlite3.Error, SchemaError, StoreUnavailable]
    psycopg = sys.modules.get("psycopg")
    if psycopg is not None:
        errors.append(psycopg.Error)
    return tuple(errors)


def listen(host: str, port: int) -> list[socket.socket]:
    """Listening sockets on every address ``host`` names; ``OSError`` if one of them
    cannot be bound (those already made are closed)."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(
            (i[0], i[1], i[2], i[3], i[4]) for i in infos
        ):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(BACKLOG)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets
