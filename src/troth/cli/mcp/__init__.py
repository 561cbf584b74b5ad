"""``troth mcp``: durable promises for AI agents over the Model Context Protocol.

An MCP server (stdio by default, Streamable HTTP with ``--http PORT``) whose tools
create, read, settle, search and wait on promises, start durable functions, and
explain workflows, on any server of the Resonate protocol — a client of it exactly
as the other client commands are (``--server``/``-S``, ``RESONATE_URL``,
``-T``/``RESONATE_TOKEN``).  It needs the optional ``mcp`` package (troth's
``mcp`` extra); nothing here imports it until the command runs, so
``troth --help`` works without it.  docs/mcp.md says how to use it.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import sys
from typing import Any

from troth.cli.remote import DEFAULT_SERVER

EXIT_MISSING = 2


MCP_EPILOG = """\
examples:
  troth mcp                          MCP over stdio, to http://127.0.0.1:8001
  troth mcp -S https://troth.example:8001 -T "$RESONATE_TOKEN"
  troth mcp --http 8765              Streamable HTTP on 127.0.0.1:8765, /mcp"""


def add_mcp_command(sub: Any) -> None:
    from troth.cli.help import Formatter

    p: argparse.ArgumentParser = sub.add_parser(
        "mcp",
        help="serve MCP tools for AI agents (docs/mcp.md)",
        description="An MCP server for AI agents (Claude, Cursor, any MCP client): "
        "tools that create, read, settle, search and wait on promises, start "
        "durable functions, and explain workflows, on any server of the Resonate "
        "protocol. It speaks MCP over stdio, or Streamable HTTP with --http. It needs "
        "troth's mcp extra (pip install 'troth[mcp]').",
        epilog=MCP_EPILOG,
        formatter_class=Formatter,
    )
    p.add_argument(
        "-S",
        "--server",
        default=os.environ.get("RESONATE_URL") or DEFAULT_SERVER,
        help=f"server URL (default: $RESONATE_URL or {DEFAULT_SERVER})",
    )
    p.add_argument(
        "-T", "--token", default=os.environ.get("RESONATE_TOKEN"), help="token ($RESONATE_TOKEN)"
    )
    p.add_argument(
        "--http", type=int, metavar="PORT", help="serve Streamable HTTP at /mcp (default: stdio)"
    )
    p.add_argument("--host", default="127.0.0.1", help="address --http binds (127.0.0.1)")
    p.add_argument(
        "--listen-group",
        default="mcp",
        help="poll group of promise-wait's stream (default %(default)s)",
    )


def run_mcp(args: argparse.Namespace) -> int:
    try:
        from troth.cli.mcp.server import Config, serve_http, serve_stdio
    except ImportError as exc:
        if getattr(exc, "name", "") and str(exc.name).split(".")[0] in ("mcp", "mcp_types"):
            print(
                "troth: `troth mcp` needs the mcp package: install troth's mcp extra "
                "(pip install -e '.[mcp]' in the repository)",
                file=sys.stderr,
            )
            return EXIT_MISSING
        raise
    # stdout is the protocol's (stdio): the log goes to stderr, where MCP hosts keep it.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    config = Config(args.server, args.token, args.listen_group)
    if args.http is None:
        serve_stdio(config)
        return 0
    if not _loopback(args.host):
        print(
            f"troth: warning: MCP over HTTP on {args.host}: whoever reaches it acts with "
            "this process's token (send your own as Authorization: Bearer)",
            file=sys.stderr,
        )
    serve_http(config, args.host, args.http)
    return 0


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
