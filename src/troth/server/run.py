"""Build the store, engine and app from settings, and run them under uvicorn.

uvicorn handles SIGTERM/SIGINT: it stops accepting, lets in-flight requests finish,
then runs the app's shutdown, which stops the timer and lets the writer commit what
was queued before the store closes.
"""

from __future__ import annotations

import gc
import logging
import socket
import ssl
import sys
from collections.abc import Callable
from typing import Any

import uvicorn

from troth import __version__, redact
from troth.engine import DEADLINE, Commit, Engine
from troth.engine.health import WRITABLE, WRITE_ERRORS
from troth.machine.internal import Config
from troth.outbox import codes
from troth.outbox.types import DispatchConfig, OutboxSender
from troth.protocol.address import HTTP, HTTPS, NATS, POLL
from troth.server import logs
from troth.server.config import ConfigError, Settings, push_token_map
from troth.server.delivery.cluster import default_node_id
from troth.server.delivery.loop import DeliveryLoop
from troth.server.http.app import App
from troth.server.http.direct import http_protocol
from troth.server.http.scrape import StoreGauges
from troth.server.ingress.auth import Authenticator, announce_auth
from troth.server.logs import Throttled
from troth.server.metrics import Metrics
from troth.server.operator.retention import Archive, RetentionLoop
from troth.server.startup import EXIT_STORE, cannot_open_store
from troth.server.workers import supervise
from troth.store.base import Store
from troth.store.faults import REASONS
from troth.store.memory import MemoryStore
from troth.transport.http import HttpSender, PushTokens
from troth.transport.nats import NatsLink, NatsSender
from troth.transport.poll import PollSender, Registry
from troth.transport.router import Router
from troth.version import schema_version

#: Seconds a thread may hold the GIL while another waits for it.
SWITCH_INTERVAL = 0.0005
#: Allocations of container objects between two young-generation collections.
GC_YOUNG = 10_000


def open_store(settings: Settings) -> Store:
    if settings.store == "memory":
        return MemoryStore()
    if settings.store == "postgres":
        from troth.store.postgres import PostgresStore

        return PostgresStore(
            settings.postgres_url,
            pooled=settings.postgres_pool_mode == "transaction",
            readers=settings.postgres_readers,
            outage_wait=settings.postgres_outage_wait,
        )
    from troth.store.sqlite import SqliteStore

    return SqliteStore(settings.db, synchronous=settings.synchronous)


def build_app(settings: Settings, store: Store | None = None) -> App:
    """Wire store, engine, transports, dispatcher and metrics into one app."""
    metrics = Metrics()
    store = store or open_store(settings)
    node = settings.node_id or default_node_id()
    tracing = None
    propagate = None
    if settings.tracing:
        from troth.server import tracing as otel

        tracing = otel.enable(node, store)
        propagate = otel.inject
    deadline = DEADLINE
    if settings.store == "postgres":
        # A request waits out postgres_outage_wait (a failover) inside its batch; its
        # deadline leaves that wait a second to end in a commit or a 503 of its own.
        deadline = max(DEADLINE, settings.postgres_outage_wait + 1.0)
    # A cycle: the engine's commits lead to the delivery loop, and the delivery loop
    # is made from the engine.  The engine's hooks reach ``delivery`` when they run,
    # and it is made below, before anything can call them (the engine calls none of
    # them before the app starts it).
    delivery: DeliveryLoop

    def committed(commit: Commit) -> None:
        metrics.inc("troth_commit_batches_total")
        metrics.inc("troth_commit_jobs_total", commit.jobs)
        if commit.messages:
            delivery.after_commit(commit.messages, commit.claimed)

    engine = Engine(
        store,
        Config(retry_timeout=settings.retry_timeout),
        on_commit=committed,
        claim_in_batch=lambda: delivery.batch_claim(),
        on_resume=lambda: delivery.wake(),
        on_timer=None if tracing is None else tracing.timer,
        on_refused=count_refused(metrics),
        on_clock_jump=count_clock_jumps(metrics),
        lone_commit_here=settings.lone_commit == "loop",
        deadline=deadline,
    )
    registry = Registry(max_total=settings.max_sse, max_per_group=settings.max_sse_per_group)
    metrics.gauge("troth_sse_connections", lambda: float(registry.count()))
    metrics.gauge("troth_timer_passes_total", lambda: float(engine.stats.ticks))
    metrics.gauge("troth_timer_lag_seconds", lambda: engine.stats.lag_ms / 1000)
    watch_store_health(engine, metrics)
    http = HttpSender(
        settings.url,
        tokens=PushTokens(settings.push_token, push_token_map(settings.push_tokens)),
        propagate=propagate,
    )
    poll = PollSender(registry, settings.url)
    config = DispatchConfig(
        worker_id=node,
        send_timeout=settings.send_timeout,
        max_attempts=settings.max_attempts,
        concurrency=settings.dispatch_concurrency,
        retention=settings.outbox_retention,
        claim_timeout=max(120.0, settings.send_timeout * 4),
    )
    senders: dict[str, OutboxSender] = {POLL: poll, HTTP: http, HTTPS: http}
    nats = None
    if settings.nats_url:
        nats = NatsLink(settings.nats_url, name=f"troth {node}")
        senders[NATS] = NatsSender(nats, settings.url, flush_timeout=settings.send_timeout)
    if tracing is not None:
        senders = {scheme: tracing.sender(sender) for scheme, sender in senders.items()}
    router = Router(senders, undeliverable_reporter(metrics))
    delivery = DeliveryLoop(engine, router, config, metrics)
    cluster = None
    if store.shared:
        from troth.server.delivery.cluster import Cluster
        from troth.store.postgres import PostgresStore

        assert isinstance(store, PostgresStore)
        cluster = Cluster(
            store,
            engine,
            registry,
            delivery,
            node=node,
            url=settings.url,
            node_timeout=settings.node_timeout,
            listen_url=settings.postgres_listen_url,
        )
        watched = cluster
        metrics.gauge("troth_store_batch_reruns", lambda: float(store.retries))
        metrics.gauge("troth_cluster_notifications_heard", lambda: float(watched.heard))
        metrics.gauge("troth_cluster_claims_reaped", lambda: float(watched.reaped))
    retention = None
    if settings.retention_ms:
        retention = RetentionLoop(
            engine,
            settings.retention_ms,
            batch=settings.retention_batch,
            interval=settings.retention_interval,
            metrics=metrics,
            archive=Archive(settings.archive_dir) if settings.archive_dir else None,
            on_batch=None if tracing is None else tracing.retention,
        )
    return App(
        engine,
        settings,
        metrics=metrics,
        registry=registry,
        delivery=delivery,
        cluster=cluster,
        on_shutdown=http.close,
        node=node,
        retention=retention,
        nats=nats,
        hooks=tracing,
        scrape=StoreGauges(store, metrics, cluster, engine.flow).refresh,
    )


def count_refused(metrics: Metrics) -> Callable[[str], None]:
    """The engine's ``on_refused``: ``troth_store_write_errors_total{reason}``, every
    reason's series there from the start (engine/health.py)."""
    for reason in REASONS:
        metrics.inc(WRITE_ERRORS, 0, reason=reason)
    return lambda reason: metrics.inc(WRITE_ERRORS, reason=reason)


def count_clock_jumps(metrics: Metrics) -> Callable[[int], None]:
    """The engine's ``on_clock_jump``: ``troth_clock_jumps_total``, the steps of the
    wall clock the timer noticed (engine/clock.py), there from the start."""
    metrics.inc("troth_clock_jumps_total", 0)
    return lambda ms: metrics.inc("troth_clock_jumps_total")


def watch_store_health(engine: Engine, metrics: Metrics) -> None:
    """The gauges read from the engine when scraped: ``troth_store_writable``
    (engine/health.py) and ``troth_clock_last_jump_seconds`` (engine/clock.py); their
    counters are the engine's hooks (:func:`count_refused`, :func:`count_clock_jumps`)."""
    health = engine.health
    metrics.gauge(WRITABLE, lambda: 0.0 if health.fault is not None else 1.0)
    watch = engine.clock_watch
    metrics.gauge("troth_clock_last_jump_seconds", lambda: watch.last_jump_ms / 1000)


def undeliverable_reporter(metrics: Metrics) -> Callable[[str, str], None]:
    """What the router calls for a row this node has no transport for (an unknown
    scheme, ``nats://`` without ``nats_url``): counted, and logged at most once a
    second per reason, so that such a row never fails in silence."""
    warn = Throttled(logging.getLogger("troth.delivery"))

    def report(address: str, code: str) -> None:
        metrics.inc("troth_undeliverable_total", code=code)
        why = "no nats_url is configured" if code == codes.NATS_OFF else "unknown scheme"
        warn.warning(code, "cannot deliver to %s: %s (%s)", redact.url(address[:200]), why, code)

    return report


def tune_gc() -> None:
    """Keep the cyclic garbage collector off the request path's tail.

    A full collection walks every object the process holds, most of them modules,
    classes and functions that live as long as the server; it ran two or three times
    a second under load and took ~18 ms each time, stalling every request in flight:
    it was the p99 of create-settle (24 ms; 7.7 ms after).  ``gc.freeze`` moves what
    exists once the app is built out of the collector's sight, so a full collection
    looks only at what came later (~1 ms).  A young generation of 10,000 rather than
    700 objects collects less often for the same garbage (+5 % create-settle).
    Cycles are still collected; only their timing changes."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG, older, oldest)


def configure_logging(settings: Settings) -> None:
    """Every line of the process in one format (``server/logs.py``); with tracing on,
    a JSON line names the span it was logged in (``server/tracing.current_ids``:
    OpenTelemetry is imported only then, once :func:`check_tracing` found it)."""
    trace_ids = None
    if settings.tracing:
        from troth.server.tracing import current_ids

        trace_ids = current_ids
    logs.configure(settings.log_level, settings.log_format, trace_ids=trace_ids)
    if not settings.access_log:
        logging.getLogger("troth.access").setLevel(logging.WARNING)


def serve(settings: Settings) -> int:
    """``troth serve``: one process, or with ``workers`` > 1 a supervisor of that many
    (``server/workers.py``).  A bad key or certificate is refused here, once, with one
    clear line (exit 2), before any process serves; the port is bound next, and only
    then is the database checked and migrated (:func:`check_store`), once."""
    try:
        auth = Authenticator.from_settings(
            settings.auth_publickey, settings.auth_issuer, settings.auth_audience
        )
        check_tls(settings)
        check_tracing(settings)
    except ConfigError as exc:
        print(f"troth: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings)  # after check_tracing: it may import OpenTelemetry
    announce_auth(settings, auth, logging.getLogger("troth"))
    if settings.workers > 1:
        return supervise(settings, lambda: check_store(settings), serve_on)
    return serve_on(settings, None, lambda: check_store(settings))


def check_store(settings: Settings) -> int | None:
    """What a start checks of its store once the port is bound: the database answers
    and is what the settings say (exit 4 if it cannot be reached, 2 if the settings
    contradict it, e.g. a transaction pooler), and its schema may be served (else
    exit 4), migrated here.  None: go on."""
    try:
        unreachable = check_postgres(settings)
    except ConfigError as exc:
        print(f"troth: {exc}", file=sys.stderr)
        return 2
    if unreachable is not None:
        print(f"troth: {unreachable}", file=sys.stderr)
        return EXIT_STORE
    return prepare_schema(settings)


def prepare_schema(settings: Settings) -> int | None:
    """Refuse a database this troth may not serve as it is — a newer or unknown
    schema, or one due a migration while other nodes are alive — with one line and
    exit status ``EXIT_SCHEMA`` (4); else migrate it (PostgreSQL) and return None."""
    if settings.store == "memory":
        return None
    from troth.store.sql.migrate import SchemaError
    from troth.store.upgrade import EXIT_SCHEMA, prepare

    try:
        prepare(
            settings.store,
            db=settings.db,
            postgres_url=settings.postgres_url,
            node_timeout=settings.node_timeout,
            node=settings.node_id or None,
        )
    except SchemaError as exc:
        print(f"troth: {cannot_open_store(settings, exc)}", file=sys.stderr)
        return EXIT_SCHEMA
    return None


def serve_on(
    settings: Settings,
    sock: socket.socket | None,
    check: Callable[[], int | None] | None = None,
) -> int:
    """One troth process, its settings checked by :func:`serve`: on ``sock`` (a
    ``--workers`` child's) or on ``host``/``port``, bound here before ``check`` (the
    store's checks, :func:`check_store`; an exit status stops the start) and before
    the store is opened.  Each way the start can fail is one line on stderr and an exit code of
    its own (``server/startup.py``); the "listening" line comes once the server
    accepts connections, never before."""
    # The writer thread releases the GIL around every SQLite call; with the default
    # 5 ms switch interval, taking it back waits behind the event loop and each group
    # commit stalls for milliseconds.  A short interval keeps the hand-offs short.
    sys.setswitchinterval(SWITCH_INTERVAL)
    from troth.server.announcing import AnnouncingServer
    from troth.server.startup import (
        EXIT_FAILED,
        EXIT_LISTEN,
        EXIT_OK,
        EXIT_STORE,
        cannot_listen,
        cannot_open_store,
        listen,
        store_errors,
        where,
    )

    log = logging.getLogger("troth")
    try:
        sockets = [sock] if sock is not None else listen(settings.host, settings.port)
    except OSError as exc:
        print(f"troth: {cannot_listen(settings.host, settings.port, exc)}", file=sys.stderr)
        return EXIT_LISTEN
    refused = None if check is None else check()
    if refused is not None:
        for s in sockets:
            s.close()
        return refused
    try:
        store = open_store(settings)
    except store_errors() as exc:
        for s in sockets:
            s.close()
        print(f"troth: {cannot_open_store(settings, exc)}", file=sys.stderr)
        return EXIT_STORE
    app = build_app(settings, store)
    tune_gc()

    def announce() -> None:
        log.info(
            "troth listening on %s://%s (store=%s%s, debug=%s, version=%s, schema=%d)",
            "https" if settings.tls_cert else "http",
            where(settings.host, settings.port),
            settings.store,
            f" db={settings.db} synchronous={settings.synchronous}"
            if settings.store == "sqlite"
            else "",
            settings.debug,
            __version__,
            schema_version(),
        )

    server = AnnouncingServer(uvicorn_config(app, settings), app.closing, announce)
    try:
        server.run(sockets=sockets)
    except SystemExit:
        # uvicorn exits this way when the app's startup failed (logged above it).
        if server.started:
            raise
        return EXIT_FAILED
    return EXIT_OK


def check_tracing(settings: Settings) -> None:
    """``tracing`` needs the ``troth[otel]`` extra: say so at start (exit 2)."""
    if not settings.tracing:
        return
    try:
        import opentelemetry.exporter.otlp.proto.http
        import opentelemetry.sdk  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            f"tracing needs OpenTelemetry: pip install 'troth[otel]' ({exc})"
        ) from None


def check_postgres(settings: Settings) -> str | None:
    """Connect once before serving (``store/postgres/probe.py``).  A pooler the
    settings do not expect raises :class:`ConfigError` (exit 2: the settings must
    change); a database that cannot be reached or refuses the connection is the
    returned line (exit 4: the store cannot be opened), rather than failing requests
    later."""
    if settings.store != "postgres":
        return None
    from troth.store.postgres.probe import ProbeFailed, Unreachable, probe

    try:
        probe(
            settings.postgres_url,
            pooled=settings.postgres_pool_mode == "transaction",
            listen_url=settings.postgres_listen_url,
        )
    except Unreachable as exc:
        return f"cannot open the PostgreSQL store ({exc.setting}): {exc.detail}"
    except ProbeFailed as exc:
        raise ConfigError(str(exc)) from None
    return None


def check_tls(settings: Settings) -> None:
    """Load ``tls_cert``/``tls_key`` once before serving, so that a missing, unreadable
    or mismatched pair stops the server with one clear line (exit 2) instead of a
    uvicorn traceback — and never leaves it serving plain HTTP by mistake."""
    if not settings.tls_cert:
        return
    for what, path in (("tls_cert", settings.tls_cert), ("tls_key", settings.tls_key)):
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise ConfigError(f"{what}: cannot read {path}: {exc.strerror}") from None
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
            settings.tls_cert, settings.tls_key
        )
    except (ssl.SSLError, ValueError) as exc:
        # The message names the problem (no PEM, key does not match), never key bytes.
        raise ConfigError(
            f"tls_cert/tls_key: {settings.tls_cert} and {settings.tls_key} are not a "
            f"PEM certificate chain and its private key: {exc}"
        ) from None


def uvicorn_config(app: App, settings: Settings, **overrides: Any) -> uvicorn.Config:
    """How troth runs under uvicorn: httptools with header and body read deadlines
    (``server/http/timeouts.py``), idle keep-alive connections closed after ``idle_timeout``,
    and HTTPS when ``tls_cert``/``tls_key`` are set (uvicorn's ``ssl_*`` options)."""
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "loop": "uvloop",
        "lifespan": "on",
        "access_log": False,
        # No logging configuration of uvicorn's own: its loggers propagate to troth's
        # one handler (configure_logging), so its lines share troth's format.
        "log_config": None,
        "log_level": settings.log_level.lower(),
        "timeout_keep_alive": settings.idle_timeout,
        "timeout_graceful_shutdown": 10,
        # Per-request work troth does not use: X-Forwarded-* rewriting (troth reads
        # no client address) and a "server: uvicorn" header on every answer.
        "proxy_headers": False,
        "server_header": False,
    }
    if settings.tls_cert:
        options["ssl_certfile"] = settings.tls_cert
        options["ssl_keyfile"] = settings.tls_key
    options.update(overrides)
    # POST / answered by the protocol itself (server/http/direct.py), the rest by ASGI; its
    # sweeper closes idle simple connections after the keep-alive uvicorn was given.
    if "http" not in options:
        options["http"] = http_protocol(
            settings.header_timeout, settings.body_timeout, app, options["timeout_keep_alive"]
        )
    return uvicorn.Config(app, **options)
