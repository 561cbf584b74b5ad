"""Build the store, engine and app from settings, and run them under uvicorn.

uvicorn handles SIGTERM/SIGINT: it stops accepting, lets in-flight requests finish,
then runs the app's shutdown, which stops the timer and lets the writer commit what
was queued before the store closes.
"""

from __future__ import annotations

import logging

from troth.machine.internal import Config
from troth.server.app import App
from troth.server.config import Settings
from troth.server.engine import Engine
from troth.store.base import Store
from troth.store.memory import MemoryStore


def open_store(settings: Settings) -> Store:
    if settings.store == "memory":
        return MemoryStore()
    from troth.store.sqlite import SqliteStore

    return SqliteStore(settings.db, synchronous=settings.synchronous)


def build_app(settings: Settings, store: Store | None = None) -> App:
    engine = Engine(store or open_store(settings), Config(retry_timeout=settings.retry_timeout))
    return App(engine, settings)


def configure_logging(settings: Settings) -> None:
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    if not settings.access_log:
        logging.getLogger("troth.access").setLevel(logging.WARNING)


def serve(settings: Settings) -> int:
    import uvicorn

    configure_logging(settings)
    app = build_app(settings)
    log = logging.getLogger("troth")
    log.info(
        "troth listening on http://%s:%d (store=%s%s, debug=%s)",
        settings.host,
        settings.port,
        settings.store,
        f" db={settings.db} synchronous={settings.synchronous}"
        if settings.store == "sqlite"
        else "",
        settings.debug,
    )
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level=settings.log_level.lower(),
        timeout_graceful_shutdown=10,
    )
    uvicorn.Server(config).run()
    return 0
