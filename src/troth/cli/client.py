"""The client commands: ``troth promises|tasks|schedules …``, ``troth invoke`` and
``troth tree``.

Compatible with the Resonate CLI's commands and flags, so that scripts and habits
carry over (``--server``/``-S`` or ``RESONATE_URL``, ``-T``/``--token`` or
``RESONATE_TOKEN``, durations like ``1h`` or ``1m30s``, ``--value '{"data": …}'``
whose ``data`` is base64-encoded as the SDKs send it).  They speak to a server over
HTTP only, as any remote client does.  Output is for people by default and JSON
with ``--json``.

Exit codes: 0 done; 1 the server refused (its status and message on stderr);
2 bad usage (a flag, a duration, a JSON argument); 3 the server did not answer.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any, Final

from troth.cli import bulk
from troth.cli.help import (
    CANCEL_EPILOG,
    EXPLAIN_EPILOG,
    INVOKE_EPILOG,
    OUTBOX_EPILOG,
    PROMISES_EPILOG,
    SCHEDULES_EPILOG,
    SETTLE_EPILOG,
    TASKS_EPILOG,
    TREE_EPILOG,
    WORKERS_EPILOG,
    Formatter,
)
from troth.cli.operator import limits
from troth.cli.operator.actions import show_cancel, show_retry
from troth.cli.operator.inspect import show_explain, show_outbox, show_workers
from troth.cli.remote import DEFAULT_SERVER, Remote, RemoteError, Unreachable
from troth.cli.render import Renderer
from troth.cli.requests import (
    Request,
    Usage,
    duration,
    invoke,
    promise_create,
    promise_search,
    promise_settle,
    schedule_create,
    schedule_search,
    task_acquire,
    task_action,
    task_create,
    task_heartbeat,
    task_search,
    task_suspend,
    with_optional,
)
from troth.cli.tree import show_tree

EXIT_REFUSED: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNREACHABLE: Final = 3

# -- the parsers ------------------------------------------------------------------------------


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-S",
        "--server",
        metavar="URL",
        default=os.environ.get("RESONATE_URL") or DEFAULT_SERVER,
        help=f"server URL (default: $RESONATE_URL or {DEFAULT_SERVER})",
    )
    common.add_argument(
        "-T",
        "--token",
        default=os.environ.get("RESONATE_TOKEN"),
        help="bearer token, for a server with auth on (default: $RESONATE_TOKEN)",
    )
    common.add_argument("--json", action="store_true", help="print the answer as JSON")
    return common


def _command(
    group: Any,
    name: str,
    build: Callable[[argparse.Namespace], Request],
    common: argparse.ArgumentParser,
    help: str,
    aliases: tuple[str, ...] = (),
    epilog: str | None = None,
) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = group.add_parser(
        name,
        parents=[common],
        help=help,
        aliases=list(aliases),
        description=sentence(help),
        epilog=epilog,
        formatter_class=Formatter,
    )
    p.set_defaults(build=build)
    return p


def sentence(help: str) -> str:
    """A command's one-line help as the first sentence of its own ``--help``."""
    return help[:1].upper() + help[1:] + "."


def _group(sub: Any, name: str, alias: str, help: str, epilog: str) -> Any:
    """``promises``, ``tasks``, ``schedules``: a command whose first word is an action."""
    g = sub.add_parser(
        name,
        aliases=[alias],
        help=help,
        description=sentence(help),
        epilog=epilog,
        formatter_class=Formatter,
    )
    return g.add_subparsers(title="actions", dest="action", required=True, metavar="ACTION")


_VALUE_HELP: Final = 'JSON, e.g. \'{"data": "hello"}\' (data goes out base64-encoded)'


def _value_flags(p: argparse.ArgumentParser, *names: str) -> None:
    for name in names:
        p.add_argument(f"--{name}", help=_VALUE_HELP)


def _bulk_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("settle every pending promise found (instead of an ID)")
    g.add_argument("--state", help="pending (the only state a promise can be settled from)")
    g.add_argument("--tags", help='JSON object, e.g. \'{"resonate:origin": "wf"}\'')
    g.add_argument("--id-prefix", metavar="PREFIX", help="only ids starting with PREFIX")
    g.add_argument("--dry-run", action="store_true", help="count and show them, change nothing")
    g.add_argument("--yes", action="store_true", help="do not ask for a confirmation")


def add_client_commands(sub: Any) -> None:
    """Register ``promises``, ``tasks``, ``schedules`` and ``invoke`` on ``sub``."""
    common = _common()

    ps = _group(
        sub, "promises", "promise", "get, create, settle and search promises", PROMISES_EPILOG
    )
    p = _command(ps, "get", lambda a: ("promise.get", {"id": a.id}), common, "show one promise")
    p.add_argument("id", help="the promise's id")
    p = _command(ps, "create", promise_create, common, "create a promise")
    p.add_argument("id", help="the new promise's id")
    p.add_argument("--timeout", required=True, help="duration until it times out, e.g. 1h")
    _value_flags(p, "param")
    p.add_argument("--tags", help='JSON object, e.g. \'{"k": "v"}\'')
    for name, state in (
        ("resolve", "resolved"),
        ("reject", "rejected"),
        ("cancel", "rejected_canceled"),
    ):
        p = _command(
            ps,
            name,
            promise_settle(state),
            common,
            f"settle a promise, or every pending one found, as {state}",
            epilog=SETTLE_EPILOG.format(verb=name),
        )
        p.add_argument("id", nargs="?", help="the promise's id (or filters instead)")
        _value_flags(p, "value")
        _bulk_flags(p)
    p = _command(ps, "search", promise_search, common, "list promises by state and tags")
    p.add_argument("--state", help="pending, resolved, rejected, rejected_canceled, …")
    p.add_argument("--tags", help='JSON object, e.g. \'{"resonate:origin": "wf"}\'')
    p.add_argument("--limit", type=int, default=100, help="most promises shown (%(default)s)")
    p.add_argument("--cursor", help="where the previous page ended")
    p = _command(
        ps,
        "register-callback",
        lambda a: ("promise.register_callback", {"awaited": a.awaited, "awaiter": a.awaiter}),
        common,
        "make awaiter's task resume when awaited settles",
    )
    p.add_argument("awaited", help="the promise waited on")
    p.add_argument("awaiter", help="the promise whose task resumes")
    p = _command(
        ps,
        "register-listener",
        lambda a: ("promise.register_listener", {"awaited": a.awaited, "address": a.address}),
        common,
        "send an unblock to address when awaited settles",
    )
    p.add_argument("awaited", help="the promise waited on")
    p.add_argument("address", help="where the unblock goes, e.g. poll://any@workers")

    ts = _group(sub, "tasks", "task", "get, acquire, fulfill and search tasks", TASKS_EPILOG)
    p = _command(ts, "get", lambda a: ("task.get", {"id": a.id}), common, "show one task")
    p.add_argument("id", help="the task's id (its promise's)")
    p = _command(ts, "create", task_create, common, "create a promise and its task, acquired")
    p.add_argument("id", help="the task's id")
    p.add_argument("--pid", required=True, help="the process that holds the task")
    p.add_argument("--ttl", required=True, help="lease duration, e.g. 15s")
    p.add_argument("--timeout", required=True, help="the promise's timeout, e.g. 1h")
    _value_flags(p, "param")
    p.add_argument("--tags", help='JSON object, e.g. \'{"k": "v"}\'')
    p.add_argument(
        "--target",
        default="poll://any@default",
        help="unless --tags names one (default %(default)s)",
    )
    p = _command(ts, "acquire", task_acquire, common, "acquire a pending task", ("claim",))
    p.add_argument("id", help="the task's id")
    p.add_argument("--pid", required=True, help="the process that holds the task")
    p.add_argument("--version", type=int, required=True, help="the task's version, as acquired")
    p.add_argument("--ttl", required=True, help="lease duration, e.g. 15s")
    for name, kind, aliases, what in (
        ("fence", "task.fence", (), "create or settle a promise, fenced by the task's version"),
        ("fulfill", "task.fulfill", ("complete",), "settle the task's promise and finish it"),
    ):
        p = _command(ts, name, task_action(kind), common, what, aliases)
        p.add_argument("id", help="the task's id")
        p.add_argument("--version", type=int, required=True, help="the task's version, as acquired")
        p.add_argument("--action", required=True, help='JSON: {"kind": …, "data": {…}}')
    p = _command(ts, "suspend", task_suspend, common, "suspend until awaited promises settle")
    p.add_argument("id", help="the task's id")
    p.add_argument("--version", type=int, required=True, help="the task's version, as acquired")
    p.add_argument("--actions", required=True, help="JSON array of register_callback actions")
    p = _command(ts, "heartbeat", task_heartbeat, common, "extend a process's leases")
    p.add_argument("--pid", required=True, help="the process that holds the task")
    p.add_argument("--tasks", required=True, help='JSON array: [{"id": …, "version": …}]')
    p = _command(
        ts,
        "release",
        lambda a: ("task.release", {"id": a.id, "version": a.version}),
        common,
        "give an acquired task back",
    )
    p.add_argument("id", help="the task's id")
    p.add_argument("--version", type=int, required=True, help="the task's version, as acquired")
    for name in ("halt", "continue"):
        what = "stop a task from running" if name == "halt" else "let a halted task run again"
        p = _command(ts, name, _by_id(f"task.{name}"), common, what)
        p.add_argument("id", help="the task's id")
    p = _command(ts, "search", task_search, common, "list tasks by state")
    p.add_argument("--state", help="pending, acquired, suspended, halted or fulfilled")
    p.add_argument("--limit", type=int, default=100, help="most shown (%(default)s)")
    p.add_argument("--cursor", help="where the previous page ended")

    ss = _group(
        sub, "schedules", "schedule", "get, create, delete and search schedules", SCHEDULES_EPILOG
    )
    for name in ("get", "delete"):
        what = "show one schedule" if name == "get" else "delete a schedule"
        p = _command(ss, name, _by_id(f"schedule.{name}"), common, what)
        p.add_argument("id", help="the schedule's id")
    p = _command(ss, "create", schedule_create, common, "create a schedule")
    p.add_argument("id", help="the schedule's id")
    p.add_argument("--cron", required=True, help='cron expression, e.g. "*/5 * * * *"')
    p.add_argument("--promise-id", required=True, help="template, e.g. report.{{.timestamp}}")
    p.add_argument("--promise-timeout", required=True, help="duration, e.g. 1h")
    _value_flags(p, "promise-param")
    p.add_argument("--promise-tags", help='JSON object, e.g. \'{"k": "v"}\'')
    p = _command(ss, "search", schedule_search, common, "list schedules by tags")
    p.add_argument("--tags", help='JSON object, e.g. \'{"k": "v"}\'')
    p.add_argument("--limit", type=int, default=10, help="most shown (%(default)s)")
    p.add_argument("--cursor", help="where the previous page ended")

    p = _command(
        sub,
        "invoke",
        invoke,
        common,
        "start a function on a worker group, as an SDK does",
        epilog=INVOKE_EPILOG,
    )
    p.add_argument("func", help="the function's registered name")
    p.add_argument("--id", required=True, help="the call's promise id")
    p.add_argument("--arg", action="append", help="an argument (JSON, or a plain string)")
    p.add_argument("--json-args", help="all arguments as one JSON array")
    p.add_argument(
        "--version",
        dest="func_version",
        type=int,
        default=1,
        metavar="N",
        help="the function's version (%(default)s)",
    )
    p.add_argument("-t", "--timeout", default="1h", help="how long the call may take (default: 1h)")
    p.add_argument("--target", default="poll://any@default", help="the worker group (%(default)s)")
    p.add_argument("--delay", help="start after this duration, e.g. 5m")

    p = _command(
        sub,
        "tree",
        _local("tree"),
        common,
        "show a workflow's call graph, with states and tasks",
        epilog=TREE_EPILOG,
    )
    p.add_argument("id", help="the workflow's root promise id")
    p.add_argument("--all", action="store_true", help="unfold long runs of settled siblings")

    p = _command(
        sub,
        "explain",
        _local("explain"),
        common,
        "say why a workflow is not done",
        epilog=EXPLAIN_EPILOG,
    )
    p.add_argument("id", help="a promise id (a workflow's root, or any of its promises)")
    _command(
        sub,
        "workers",
        _local("workers"),
        common,
        "list connected workers by group and node",
        epilog=WORKERS_EPILOG,
    )
    p = _command(
        sub,
        "outbox",
        _outbox,
        common,
        "list the messages to deliver, newest first",
        epilog=OUTBOX_EPILOG,
    )
    p.add_argument(
        "--state",
        choices=["pending", "dispatching", "completed", "failed", "outcome_unknown"],
        metavar="STATE",
        help="only the messages in this state: pending, dispatching, completed, failed"
        " or outcome_unknown",
    )
    p.add_argument("--task", help="only the executes written for this task")
    p.add_argument("--limit", type=int, default=50, help="most shown (%(default)s)")
    p.add_argument("--before", help="rows older than this id (the next page)")
    p.add_argument(
        "action",
        nargs="?",
        choices=["retry"],
        help="retry: offer the deliveries that failed for good again, with fresh attempts",
    )
    p.add_argument("--target", help="retry: only those to this address or worker group")
    p.add_argument("--since", help="retry: only those that failed within this duration, e.g. 1h")
    p.add_argument(
        "--dry-run", action="store_true", help="retry: count what would be retried, change nothing"
    )

    p = _command(
        sub,
        "cancel",
        _cancel,
        common,
        "cancel a workflow: every pending promise of its tree, the root first",
        epilog=CANCEL_EPILOG,
    )
    p.add_argument("id", help="the workflow's root promise id")
    p.add_argument("--reason", help="why, kept in the cancelled promises' value")

    p = _command(
        sub,
        "limits",
        _limits,
        common,
        "the concurrency and rate limits of worker groups: set, get, list, delete",
        epilog=limits.EPILOG,
    )
    p.add_argument("action", choices=limits.ACTIONS, help="what to do")
    p.add_argument("group", nargs="?", help="the worker group (poll://any@GROUP) or push target")
    p.add_argument("--concurrency", type=int, help="set: at most this many of its tasks at once")
    p.add_argument("--rate", help="set: at most R of its tasks start per second (R/s, R/m, R/h)")
    p.add_argument("--burst", type=int, help="set, with --rate: up to B start at once (default 1)")
    p.add_argument("--per-key", type=int, help="set: at most N tasks of one troth:key tag at once")


def _local(kind: str) -> Callable[[argparse.Namespace], Request]:
    """Commands that are not one protocol request: run_client runs them (LOCAL)."""
    return lambda a: (kind, {"id": a.id} if hasattr(a, "id") else {})


def _outbox(a: argparse.Namespace) -> Request:
    if a.action == "retry":
        if a.state or a.task or a.before:
            raise Usage("outbox retry takes --target, --since and --dry-run only")
        body: dict[str, Any] = {"dryRun": a.dry_run}
        if a.target:
            body["target"] = a.target
        if a.since:
            body["since"] = duration(a.since, "--since")
        return "outbox-retry", body
    if a.target or a.since or a.dry_run:
        raise Usage("--target, --since and --dry-run go with `troth outbox retry`")
    params = {"state": a.state, "task": a.task, "limit": str(a.limit), "before": a.before}
    return "outbox", {k: v for k, v in params.items() if v}


#: Commands drawn from several requests or from troth's operator API.
LOCAL: Final[dict[str, Callable[[Remote, dict[str, Any], Renderer, argparse.Namespace], None]]] = {
    "tree": lambda remote, data, r, a: show_tree(remote, data["id"], r, unfold=a.all),
    "explain": lambda remote, data, r, a: show_explain(remote, data["id"], r),
    "workers": lambda remote, data, r, a: show_workers(remote, r),
    "outbox": lambda remote, data, r, a: show_outbox(remote, r, data),
    "outbox-retry": lambda remote, data, r, a: show_retry(remote, r, data),
    "cancel": lambda remote, data, r, a: show_cancel(remote, r, data),
    limits.KIND: lambda remote, data, r, a: limits.show(remote, r, data),
}


def _limits(a: argparse.Namespace) -> Request:
    try:
        return limits.build(a)
    except limits.Usage as exc:
        raise Usage(str(exc)) from exc


def _cancel(a: argparse.Namespace) -> Request:
    return "cancel", with_optional({"id": a.id}, reason=a.reason)


def _by_id(kind: str) -> Callable[[argparse.Namespace], Request]:
    return lambda a: (kind, {"id": a.id})


def run_client(args: argparse.Namespace) -> int:
    """Run one parsed client command; the exit code."""
    err = sys.stderr
    try:
        kind, data = args.build(args)
    except Usage as exc:
        print(f"troth: {exc}", file=err)
        return EXIT_USAGE
    remote = Remote(args.server, args.token)
    if kind == bulk.KIND:
        return bulk.run(remote, data, args)
    renderer = Renderer(sys.stdout, as_json=args.json)
    try:
        local = LOCAL.get(kind)
        if local is not None:
            local(remote, data, renderer, args)
            return 0
        answer = remote.ok(kind, data)
    except RemoteError as exc:
        print(f"troth: {exc.kind} refused: {exc.status} {exc.message}", file=err)
        return EXIT_REFUSED
    except Unreachable as exc:
        print(f"troth: {exc}", file=err)
        return EXIT_UNREACHABLE
    try:
        renderer.show(kind, answer)
        sys.stdout.flush()
    except BrokenPipeError:  # e.g. `| head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
