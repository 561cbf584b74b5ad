"""The ``troth`` command: its parser, the server's options, and the dispatch to each
command (the client commands in ``client.py``, ``token`` in ``token.py``, ``backup``
and ``migrate-store`` in ``storage.py``, ``migrate`` in ``migrate.py``, ``mcp`` in
``mcp/``; ``bench`` is the benchmark lab, ``troth_bench``, a distribution of its own:
``troth-bench``, ``bench/`` in the checkout, run when it is installed).

What a user reads (descriptions, help, examples) is written here for the terminal;
this docstring is for contributors and is never shown.  The server's options come in
groups that are the README's configuration table, section for section
(tests/cli/test_help.py fails on any drift between the two).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from typing import Any

from troth.cli import mcp as mcp_command
from troth.cli.client import add_client_commands, run_client
from troth.cli.help import Formatter, default_text
from troth.cli.migrate import add_migrate_command, run_migrate
from troth.cli.storage import add_storage_commands, run_storage
from troth.cli.token import add_token_command, run_token
from troth.server.config import NAMES, ConfigError, Settings, load
from troth.server.startup import EXIT_CONFIG, EXIT_INTERRUPTED
from troth.version import describe

#: What ``troth dev`` starts from: a memory store, the debug operations on.
DEV = Settings(store="memory", debug=True)

DESCRIPTION = """\
troth is a durable promise server for the Resonate SDKs, and a command-line
client of any server that speaks the Resonate protocol."""

EPILOG = """\
The client commands ask a running server: --server URL, or $RESONATE_URL, or
http://127.0.0.1:8001. explain, workers and outbox need a troth server; the
others work with any server of the Resonate protocol.

examples:
  troth serve                      serve troth.db on http://127.0.0.1:8001
  troth dev                        a debug server that keeps nothing
  troth promises get order-42      one promise, its state and values
  troth explain order-42           why a workflow is not done

Run 'troth COMMAND --help' for the options and examples of a command."""

SERVE_DESCRIPTION = """\
Run the troth server: the Resonate protocol on POST /, workers' messages on
GET /poll/GROUP/ID, health on /health and /ready, the dashboard on /ui/.

Every option is also an environment variable and a key of troth.toml under the
same name: --retry-timeout is TROTH_RETRY_TIMEOUT and retry_timeout = 5000.
Options win over the environment, which wins over the file."""

SERVE_EPILOG = """\
examples:
  troth serve
  troth serve --host 0.0.0.0 --auth-publickey troth-public.pem
  troth serve --store postgres --postgres-url postgresql://troth@db/troth
  troth serve --tls-cert cert.pem --tls-key key.pem --port 8443
  TROTH_RETENTION=7d troth serve --archive-dir /var/lib/troth/archive

exit codes: 1 unexpected error, 2 a setting cannot be used, 3 cannot listen
on the address, 4 the store cannot be opened, 130 Ctrl-C, 143 SIGTERM."""

DEV_DESCRIPTION = """\
Run a debug server on a fresh in-memory store: nothing to set up, nothing kept
when it stops. The debug.* operations and resonate:debug_time are on. It takes
every option of 'troth serve'."""

DEV_EPILOG = """\
examples:
  troth dev
  troth dev --port 8002
  troth dev --store sqlite --db scratch.db     keep what it does in a file"""

BENCH_DESCRIPTION = """\
Load-test a troth server over real HTTP and SSE, next to this machine's own
limits measured in the same run. Without --url it starts a server of its own on
a temporary SQLite file (or a throwaway PostgreSQL database) and removes it."""

BENCH_EPILOG = """\
examples:
  troth bench
  troth bench --workloads create-settle --duration 5
  troth bench --open-loop sweep --chart curve.svg
  troth bench --store postgres --nodes 1,2
  troth bench --url http://127.0.0.1:8001 --workloads reads"""

#: ``troth bench`` without the lab installed (it is not in troth's wheel): exit 2.
BENCH_MISSING = """\
troth bench: the benchmark lab (troth-bench) is not installed. From troth's
checkout: pip install -e ./bench  (./scripts/test installs it in .venv)"""


def bench_lab_installed() -> bool:
    """Whether ``troth_bench`` (the ``troth-bench`` distribution) can be imported.  Only
    its absence counts: a lab that is there but fails to import says why itself."""
    return importlib.util.find_spec("troth_bench") is not None


def flag(
    group: Any, name: str, help: str, *, base: Settings, shown: str | None = None, **kw: Any
) -> None:
    """The option of setting ``name``: ``--name-with-dashes``, its help ending with the
    default (``shown`` when the default is worked out at start, such as server_url).
    A number of seconds reads ``SECONDS``, another number ``N``."""
    default = shown if shown is not None else default_text(getattr(base, name))
    help = f"{help} (default: {default})"
    if "action" not in kw and "choices" not in kw and "metavar" not in kw:
        kind = kw.get("type")
        kw["metavar"] = "SECONDS" if kind is float else "N" if kind is int else name.upper()
    group.add_argument(f"--{name.replace('_', '-')}", dest=name, help=help, **kw)


def add_server_flags(p: argparse.ArgumentParser, base: Settings | None = None) -> None:
    """The options of ``serve`` and ``dev``, one argument group per section of the
    README's configuration table; a new setting goes into its group here and into
    the same section there.  Defaults shown are ``base``'s (dev has its own)."""
    b = base or Settings()
    p.add_argument(
        "--config", metavar="PATH", help="a troth.toml (default: ./troth.toml if present)"
    )

    http = p.add_argument_group("HTTP")
    flag(
        http, "host", "address to listen on; 0.0.0.0 serves other machines", base=b, metavar="HOST"
    )
    flag(http, "port", "port of the protocol, health checks and dashboard", base=b, type=int)
    flag(
        http,
        "server_url",
        "URL that execute messages give workers as this server's",
        base=b,
        shown="http://host:port",
        metavar="URL",
    )
    flag(
        http,
        "ui",
        "serve the dashboard at /ui/",
        base=b,
        action=argparse.BooleanOptionalAction,
    )

    store = p.add_argument_group("store")
    flag(store, "store", "where promises live", base=b, choices=["memory", "sqlite", "postgres"])
    flag(store, "db", "the SQLite file", base=b, metavar="PATH")
    flag(
        store,
        "synchronous",
        "SQLite durability: full syncs every commit to disk; normal may lose the last"
        " commits on power loss",
        base=b,
        choices=["full", "normal"],
    )
    flag(
        store,
        "lone_commit",
        "where a request alone commits on SQLite: loop (sooner) or writer",
        base=b,
        choices=["loop", "writer"],
    )
    flag(
        store,
        "postgres_url",
        "PostgreSQL connection URI, with --store postgres",
        base=b,
        metavar="URL",
    )
    flag(
        store,
        "postgres_pool_mode",
        "transaction when postgres_url leads to a pooler in transaction mode (PgBouncer)",
        base=b,
        choices=["session", "transaction"],
    )
    flag(
        store,
        "postgres_listen_url",
        "direct PostgreSQL URI for LISTEN, when postgres_url is a transaction pooler",
        base=b,
        shown="none",
        metavar="URL",
    )
    flag(
        store,
        "postgres_readers",
        "connections that serve reads (0: the writer's)",
        base=b,
        type=int,
    )
    flag(
        store,
        "postgres_outage_wait",
        "seconds a request waits for an unreachable database before its 503",
        base=b,
        type=float,
    )

    delivery = p.add_argument_group("delivery")
    flag(
        delivery,
        "retry_timeout",
        "milliseconds between re-sends of a pending task's execute",
        base=b,
        type=int,
        metavar="MS",
    )
    flag(delivery, "keepalive", "seconds between SSE keep-alives", base=b, type=float)
    flag(
        delivery,
        "send_timeout",
        "seconds a delivery may take before its outcome counts as unknown",
        base=b,
        type=float,
    )
    flag(delivery, "max_attempts", "deliveries of one message before it fails", base=b, type=int)
    flag(delivery, "dispatch_concurrency", "deliveries in flight at once", base=b, type=int)
    flag(
        delivery,
        "outbox_retention",
        "seconds delivered messages are kept",
        base=b,
        type=float,
    )
    flag(
        delivery,
        "flow_limits",
        "limits set at start on worker groups that have none:"
        " GROUP:concurrency=N,rate=R/s,burst=B;... (troth limits changes them)",
        base=b,
        shown="none",
        metavar="SPEC",
    )

    auth = p.add_argument_group("auth and TLS")
    flag(
        auth,
        "auth_publickey",
        "PEM public key that signs client tokens (JWT), or 'none' for unsigned tokens"
        " (development only)",
        base=b,
        shown="off",
        metavar="PEM",
    )
    flag(auth, "auth_issuer", "the iss claim every token must carry", base=b, metavar="ISS")
    flag(auth, "auth_audience", "the aud claim every token must include", base=b, metavar="AUD")
    flag(
        auth,
        "tls_cert",
        "PEM certificate chain: serve HTTPS (with --tls-key)",
        base=b,
        metavar="PEM",
    )
    flag(auth, "tls_key", "PEM private key of --tls-cert", base=b, metavar="PEM")
    flag(
        auth,
        "cors_allow_origins",
        "origins browser pages may call from: https://a.example,https://b.example or *",
        base=b,
        shown="off",
        metavar="ORIGINS",
    )
    flag(
        auth,
        "push_token",
        "bearer token sent with every HTTP push (execute, unblock)",
        base=b,
        metavar="TOKEN",
    )
    flag(
        auth,
        "push_tokens",
        "bearer tokens per push destination: host=token,host:port=token",
        base=b,
        metavar="LIST",
    )

    retention = p.add_argument_group("retention")
    flag(
        retention,
        "retention",
        "delete workflows settled longer ago than this, e.g. 7d",
        base=b,
        shown="off",
        metavar="DURATION",
    )
    flag(retention, "retention_batch", "workflows one retention batch looks at", base=b, type=int)
    flag(retention, "retention_interval", "seconds between retention passes", base=b, type=float)
    flag(
        retention,
        "archive_dir",
        "with --retention: write each workflow here before deleting it",
        base=b,
        shown="off",
        metavar="DIR",
    )

    cluster = p.add_argument_group("cluster (PostgreSQL)")
    flag(
        cluster,
        "node_id",
        "this node's name among several on one database",
        base=b,
        shown="host-pid-random",
        metavar="NAME",
    )
    flag(
        cluster,
        "node_timeout",
        "seconds without a heartbeat before a node counts as dead",
        base=b,
        type=float,
    )
    flag(cluster, "workers", "processes serving one port, each a node", base=b, type=int)

    nats = p.add_argument_group("NATS")
    flag(
        nats,
        "nats_url",
        "NATS server(s), comma-separated: serve requests and deliver to nats://",
        base=b,
        shown="off",
        metavar="URL",
    )
    flag(
        nats,
        "nats_prefix",
        "subject prefix: requests arrive on PREFIX.requests.>",
        base=b,
        metavar="PREFIX",
    )

    limits = p.add_argument_group("limits")
    flag(limits, "max_body", "largest request body in bytes", base=b, type=int)
    flag(limits, "max_depth", "deepest JSON nesting of a request body", base=b, type=int)
    flag(limits, "max_id_length", "bytes of an id or a tag key", base=b, type=int)
    flag(limits, "max_tag_length", "bytes of a tag value", base=b, type=int)
    flag(limits, "max_sse", "open SSE connections on this node", base=b, type=int)
    flag(limits, "max_sse_per_group", "open SSE connections of one poll group", base=b, type=int)
    flag(limits, "header_timeout", "seconds for a request's headers", base=b, type=float)
    flag(limits, "body_timeout", "seconds for a request's body", base=b, type=float)
    flag(limits, "idle_timeout", "seconds an idle connection is kept", base=b, type=float)

    logging = p.add_argument_group("logging")
    flag(logging, "log_level", "debug, info, warning or error", base=b, metavar="LEVEL")
    flag(
        logging,
        "log_format",
        "plain lines for people, or json: one object a line",
        base=b,
        choices=["plain", "json"],
    )
    flag(
        logging,
        "tracing",
        "OpenTelemetry spans to OTEL_EXPORTER_OTLP_ENDPOINT (needs troth[otel])",
        base=b,
        action="store_const",
        const=True,
    )
    flag(
        logging,
        "access_log",
        "one line per request",
        base=b,
        action=argparse.BooleanOptionalAction,
    )

    development = p.add_argument_group("development")
    flag(
        development,
        "debug",
        "enable the debug.* operations and resonate:debug_time",
        base=b,
        action="store_const",
        const=True,
    )


def settings_from(args: argparse.Namespace, base: Settings | None = None) -> Settings:
    """The settings the parsed options ask for, layered on ``troth.toml`` and
    ``TROTH_*`` (``load``); an option left out is None and overrides nothing."""
    overrides: dict[str, Any] = {name: getattr(args, name) for name in NAMES if name in args}
    return load(overrides, toml_path=args.config, base=base)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: every command, its options, help and examples."""
    parser = argparse.ArgumentParser(
        prog="troth", description=DESCRIPTION, epilog=EPILOG, formatter_class=Formatter
    )
    parser.add_argument("--version", action="version", version=describe())
    sub = parser.add_subparsers(title="commands", dest="command", required=True, metavar="COMMAND")
    serve = sub.add_parser(
        "serve",
        help="run the server",
        usage="%(prog)s [OPTIONS]",
        description=SERVE_DESCRIPTION,
        epilog=SERVE_EPILOG,
        formatter_class=Formatter,
    )
    add_server_flags(serve)
    dev = sub.add_parser(
        "dev",
        help="run a throwaway debug server in memory",
        usage="%(prog)s [OPTIONS]",
        description=DEV_DESCRIPTION,
        epilog=DEV_EPILOG,
        formatter_class=Formatter,
    )
    add_server_flags(dev, DEV)
    add_token_command(sub)
    add_storage_commands(sub)
    if bench_lab_installed():
        from troth_bench.options import add_bench_flags

        bench = sub.add_parser(
            "bench",
            help="measure a server and this machine",
            usage="%(prog)s [OPTIONS]",
            description=BENCH_DESCRIPTION,
            epilog=BENCH_EPILOG,
            formatter_class=Formatter,
        )
        add_bench_flags(bench)
    else:
        # Whatever follows (--help too) is left to main(), which says how to install it.
        sub.add_parser(
            "bench",
            help="measure a server and this machine (needs troth-bench)",
            usage="%(prog)s [OPTIONS]",
            description=BENCH_DESCRIPTION,
            add_help=False,
        )
    add_client_commands(sub)
    mcp_command.add_mcp_command(sub)
    add_migrate_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if args.command == "bench" and not bench_lab_installed():
        print(BENCH_MISSING, file=sys.stderr)
        return EXIT_CONFIG
    if unknown:  # what parse_args would have refused
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command == "token":
        return run_token(args)
    if args.command in ("backup", "migrate-store"):
        return run_storage(args)
    if args.command == "migrate":
        return run_migrate(args)
    if getattr(args, "build", None) is not None:
        return run_client(args)
    if args.command == "bench":
        from troth_bench.runner import run_from_args

        return run_from_args(args)
    if args.command == "mcp":
        return mcp_command.run_mcp(args)
    try:
        settings = settings_from(args, DEV if args.command == "dev" else None)
    except ConfigError as exc:
        print(f"troth: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    from troth.server.run import serve as run_server

    try:
        return run_server(settings)
    except KeyboardInterrupt:
        # Ctrl-C: uvicorn shuts down gracefully, then raises SIGINT again so that the
        # process ends as interrupted; the shell's convention for that, not a traceback.
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(main())
