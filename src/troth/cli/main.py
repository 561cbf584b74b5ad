"""``troth serve``, ``troth dev``, ``troth bench``, ``troth token`` (``cli/token.py``),
``troth backup`` and ``troth migrate-store`` (``cli/storage.py``), ``troth migrate``
(``cli/migrate.py``), and the client
commands (``troth promises|tasks|schedules …``, ``troth invoke``: ``cli/client.py``).

``serve`` runs the server on the configured store (SQLite file ``troth.db`` by
default).  ``dev`` is ``serve --debug`` on a fresh in-memory store: zero
configuration, nothing left behind.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from troth.bench.options import add_bench_flags
from troth.cli import mcp as mcp_command
from troth.cli.client import add_client_commands, run_client
from troth.cli.migrate import add_migrate_command, run_migrate
from troth.cli.storage import add_storage_commands, run_storage
from troth.cli.token import add_token_command, run_token
from troth.server.config import ConfigError, Settings, load
from troth.version import describe

#: Exit status of a server stopped with Ctrl-C (128 + SIGINT, as a shell reports it).
EXIT_INTERRUPTED = 130


def add_server_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="path of a troth.toml (default: ./troth.toml if present)")
    p.add_argument("--host", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8001)")
    p.add_argument("--store", choices=["memory", "sqlite", "postgres"], help="storage backend")
    p.add_argument("--db", help="SQLite database file (default troth.db)")
    p.add_argument("--synchronous", choices=["full", "normal"], help="SQLite durability")
    p.add_argument("--postgres-url", help="PostgreSQL connection URI (with --store postgres)")
    p.add_argument("--postgres-pool-mode", choices=["session", "transaction"], help="pooler mode")
    p.add_argument("--postgres-listen-url", help="direct PostgreSQL URI for LISTEN (pooled)")
    p.add_argument("--postgres-readers", type=int, help="connections for reads (default 2)")
    p.add_argument("--postgres-outage-wait", type=float, help="seconds to wait for the db (5)")
    p.add_argument(
        "--debug",
        action="store_const",
        const=True,
        help="enable debug.* operations and resonate:debug_time",
    )
    p.add_argument("--retry-timeout", type=int, help="ms between re-dispatches (default 5000)")
    p.add_argument("--max-body", type=int, help="largest request body in bytes (default 10 MiB)")
    p.add_argument("--max-depth", type=int, help="JSON nesting levels of a body (default 64)")
    p.add_argument("--max-id-length", type=int, help="bytes of an id or tag key (1024)")
    p.add_argument("--max-tag-length", type=int, help="bytes of a tag value (65536)")
    p.add_argument("--max-sse", type=int, help="open SSE connections on this node (4096)")
    p.add_argument("--max-sse-per-group", type=int, help="open SSE connections of one group (1024)")
    p.add_argument("--header-timeout", type=float, help="seconds for request headers (10)")
    p.add_argument("--body-timeout", type=float, help="seconds for a request body (30)")
    p.add_argument("--idle-timeout", type=float, help="seconds an idle connection stays (5)")
    p.add_argument("--log-level", help="debug, info, warning, error")
    p.add_argument("--log-format", choices=["plain", "json"], help="log lines (default plain)")
    p.add_argument(
        "--tracing", action="store_const", const=True, help="OpenTelemetry spans (troth[otel])"
    )
    p.add_argument("--server-url", help="URL that execute messages carry as head.serverUrl")
    p.add_argument("--keepalive", type=float, help="seconds between SSE keep-alives (default 5)")
    p.add_argument("--send-timeout", type=float, help="seconds before a send is unknown (30)")
    p.add_argument("--max-attempts", type=int, help="sends of one outbox row before it fails (5)")
    p.add_argument("--dispatch-concurrency", type=int, help="sends in flight at once (64)")
    p.add_argument("--outbox-retention", type=float, help="seconds delivered rows are kept")
    p.add_argument(
        "--retention", help="delete workflows settled longer ago than this (e.g. 7d; off)"
    )
    p.add_argument("--retention-batch", type=int, help="workflows per retention batch (100)")
    p.add_argument("--retention-interval", type=float, help="seconds between passes (10)")
    p.add_argument("--archive-dir", help="with --retention: archive deleted workflows here")
    p.add_argument("--node-id", help="this node's name among several (postgres)")
    p.add_argument(
        "--node-timeout", type=float, help="seconds before a silent node counts as dead (5)"
    )
    p.add_argument(
        "--auth-publickey",
        help="PEM public key that signs client JWTs, or 'none' (unsigned: development only)",
    )
    p.add_argument("--auth-issuer", help="required iss claim of every token")
    p.add_argument("--auth-audience", help="required aud claim of every token")
    p.add_argument("--push-token", help="bearer token sent with every HTTP push (execute/unblock)")
    p.add_argument(
        "--push-tokens", help="bearer tokens per push destination: host=token,host:port=token"
    )
    p.add_argument("--tls-cert", help="PEM certificate chain: serve HTTPS (with --tls-key)")
    p.add_argument("--tls-key", help="PEM private key of --tls-cert")
    p.add_argument(
        "--cors-allow-origins",
        help="origins browsers may call from: https://a.example,https://b.example or * (off)",
    )
    p.add_argument(
        "--ui",
        action=argparse.BooleanOptionalAction,
        help="serve the dashboard at /ui (default on; --no-ui turns it off)",
    )
    p.add_argument("--nats-url", help="NATS server(s): serve requests and deliver nats:// (off)")
    p.add_argument("--nats-prefix", help="subject prefix: requests on PREFIX.requests.> (resonate)")
    p.add_argument(
        "--workers", type=int, help="processes on one port, each a node (postgres; default 1)"
    )


def settings_from(args: argparse.Namespace, base: Settings | None = None) -> Settings:
    overrides: dict[str, Any] = {
        "host": args.host,
        "port": args.port,
        "store": args.store,
        "db": args.db,
        "synchronous": args.synchronous,
        "postgres_url": args.postgres_url,
        "postgres_pool_mode": args.postgres_pool_mode,
        "postgres_listen_url": args.postgres_listen_url,
        "postgres_readers": args.postgres_readers,
        "postgres_outage_wait": args.postgres_outage_wait,
        "debug": args.debug,
        "retry_timeout": args.retry_timeout,
        "max_body": args.max_body,
        "max_depth": args.max_depth,
        "max_id_length": args.max_id_length,
        "max_tag_length": args.max_tag_length,
        "max_sse": args.max_sse,
        "max_sse_per_group": args.max_sse_per_group,
        "header_timeout": args.header_timeout,
        "body_timeout": args.body_timeout,
        "idle_timeout": args.idle_timeout,
        "log_level": args.log_level,
        "log_format": args.log_format,
        "tracing": args.tracing,
        "server_url": args.server_url,
        "keepalive": args.keepalive,
        "send_timeout": args.send_timeout,
        "max_attempts": args.max_attempts,
        "retention": args.retention,
        "retention_batch": args.retention_batch,
        "retention_interval": args.retention_interval,
        "archive_dir": args.archive_dir,
        "dispatch_concurrency": args.dispatch_concurrency,
        "outbox_retention": args.outbox_retention,
        "node_id": args.node_id,
        "node_timeout": args.node_timeout,
        "auth_publickey": args.auth_publickey,
        "auth_issuer": args.auth_issuer,
        "auth_audience": args.auth_audience,
        "push_token": args.push_token,
        "push_tokens": args.push_tokens,
        "tls_cert": args.tls_cert,
        "tls_key": args.tls_key,
        "cors_allow_origins": args.cors_allow_origins,
        "ui": args.ui,
        "nats_url": args.nats_url,
        "nats_prefix": args.nats_prefix,
        "workers": args.workers,
    }
    return load(overrides, toml_path=args.config, base=base)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="troth", description=__doc__)
    parser.add_argument("--version", action="version", version=describe())
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the server")
    add_server_flags(serve)
    dev = sub.add_parser("dev", help="run a debug server on a fresh in-memory store")
    add_server_flags(dev)
    bench = sub.add_parser("bench", help="load-test a server (docs/benchmarks.md)")
    add_bench_flags(bench)
    add_client_commands(sub)
    mcp_command.add_mcp_command(sub)
    add_token_command(sub)
    add_storage_commands(sub)
    add_migrate_command(sub)
    args = parser.parse_args(argv)
    if args.command == "token":
        return run_token(args)
    if args.command in ("backup", "migrate-store"):
        return run_storage(args)
    if args.command == "migrate":
        return run_migrate(args)
    if getattr(args, "build", None) is not None:
        return run_client(args)
    if args.command == "bench":
        from troth.bench.runner import run_from_args

        return run_from_args(args)
    if args.command == "mcp":
        return mcp_command.run_mcp(args)
    try:
        if args.command == "dev":
            settings = settings_from(args, Settings(store="memory", debug=True))
        else:
            settings = settings_from(args)
    except ConfigError as exc:
        print(f"troth: {exc}", file=sys.stderr)
        return 2
    from troth.server.run import serve as run_server

    try:
        return run_server(settings)
    except KeyboardInterrupt:
        # Ctrl-C: uvicorn shuts down gracefully, then raises SIGINT again so that the
        # process ends as interrupted; the shell's convention for that, not a traceback.
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(main())
