"""The tools ``troth mcp`` offers an agent: each a JSON schema, a description an
agent can act on, and a function of the arguments that speaks to the server.

Each tool builds its request with the very functions the client commands use
(``cli/requests.py``), so a tool and its command send the same request and return
the same fields as the command's ``--json``.  Pure of the ``mcp`` package: the
server module (``server.py``) wraps these in the protocol's types.  Waiting for a
promise is not here: it needs the listener's stream (``listen.py``).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from troth.cli import requests
from troth.cli.operator.actions import CANCEL_TIMEOUT
from troth.cli.remote import Remote
from troth.cli.tree import fetch as fetch_tree
from troth.protocol.records import TAG_EXTERNAL

Handler = Callable[[Remote, dict[str, Any]], Any]


class ToolError(Exception):
    """A tool's arguments cannot be used: told to the agent, nothing was sent."""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    schema: dict[str, Any]
    #: ``None`` for the tools the server module runs itself (``promise-wait``).
    handler: Handler | None
    read_only: bool = False
    idempotent: bool = False
    destructive: bool = False


# -- schemas ----------------------------------------------------------------------------------

_ID: Final = {"type": "string", "minLength": 1}
_VALUE: Final = {
    "type": "object",
    "properties": {
        "data": {
            "description": "the payload: any JSON value, sent as the SDKs encode one "
            "(base64 of its JSON)"
        },
        "headers": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "additionalProperties": False,
}
_TAGS: Final = {"type": "object", "additionalProperties": {"type": "string"}}
_DURATION: Final = {"type": "string", "pattern": "^(0|([0-9]+(ms|s|m|h|d))+)$"}
_LIMIT: Final = {"type": "integer", "minimum": 1, "maximum": 1000}


def _schema(required: list[str], **properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def _with(base: dict[str, Any], description: str, **more: Any) -> dict[str, Any]:
    return {**base, "description": description, **more}


# -- arguments as the client commands take them ---------------------------------------------


def _namespace(args: dict[str, Any], **renamed: str) -> argparse.Namespace:
    """The arguments as the CLI's flags: JSON objects as their text (the CLI parses
    and encodes them), names as the parsers store them."""
    values: dict[str, Any] = {}
    for key, value in args.items():
        if isinstance(value, dict | list):
            value = json.dumps(value)
        values[renamed.get(key, key)] = value
    return argparse.Namespace(**values)


def _as_json(value: Any) -> Any:
    """A value whose ``data`` is the JSON text of the agent's ``data``: the CLI
    encodes that text (base64), so ``data`` goes out as the SDKs encode every
    value — base64 of JSON, a string included (the text ``yes`` goes as ``"yes"``,
    quotes and all), which an SDK workflow awaiting the promise can decode.  (The
    CLI's own flags send a string as its bare text.)"""
    if isinstance(value, dict) and value.get("data") is not None:
        return {**value, "data": json.dumps(value["data"], separators=(",", ":"))}
    return value


def _run(build: Callable[[argparse.Namespace], requests.Request], ns: argparse.Namespace) -> Any:
    try:
        return build(ns)
    except requests.Usage as exc:
        raise ToolError(str(exc)) from None


def _get(args: dict[str, Any], key: str, default: Any = None) -> Any:
    value = args.get(key)
    return default if value is None else value


def decoded(value: Any) -> Any:
    """A value's ``data`` as the SDKs encode it (base64 of JSON, or of text),
    decoded: what an agent can read.  ``None`` when there is none."""
    if not isinstance(value, dict) or not isinstance(value.get("data"), str):
        return None
    try:
        text = base64.b64decode(value["data"], validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return value["data"]
    try:
        return json.loads(text)
    except ValueError:
        return text


def with_decoded(answer: Any) -> Any:
    """An answer that holds one promise gains ``decoded: {param, value}`` beside it
    (every other field is the CLI's ``--json``, untouched)."""
    if isinstance(answer, dict) and isinstance(answer.get("promise"), dict):
        p = answer["promise"]
        return {
            **answer,
            "decoded": {"param": decoded(p.get("param")), "value": decoded(p.get("value"))},
        }
    return answer


def _send(remote: Remote, request: requests.Request) -> Any:
    kind, data = request
    return with_decoded(remote.ok(kind, data))


# -- promises ---------------------------------------------------------------------------------


def promise_create(remote: Remote, args: dict[str, Any]) -> Any:
    ns = _namespace(
        {
            "id": args["id"],
            "timeout": _get(args, "timeout", "1h"),
            "param": _as_json(args.get("param")),
            "tags": {TAG_EXTERNAL: "true", **(_get(args, "tags", {}))},
        }
    )
    return _send(remote, _run(requests.promise_create, ns))


def promise_get(remote: Remote, args: dict[str, Any]) -> Any:
    return _send(remote, ("promise.get", {"id": args["id"]}))


_RESOLUTIONS: Final = {"resolve": "resolved", "reject": "rejected", "cancel": "rejected_canceled"}


def promise_settle(remote: Remote, args: dict[str, Any]) -> Any:
    state = _RESOLUTIONS.get(args["resolution"])
    if state is None:
        raise ToolError("resolution must be resolve, reject or cancel")
    # One promise by its id: the command's filters (a bulk settle) stay unset.
    one = {"state": None, "tags": None, "id_prefix": None, "dry_run": False, "yes": False}
    ns = _namespace({"id": args["id"], "value": _as_json(args.get("value")), **one})
    return _send(remote, _run(requests.promise_settle(state), ns))


def promise_search(remote: Remote, args: dict[str, Any]) -> Any:
    ns = _namespace(
        {
            "state": args.get("state"),
            "tags": args.get("tags"),
            "limit": _get(args, "limit", 100),
            "cursor": args.get("cursor"),
        }
    )
    return _send(remote, _run(requests.promise_search, ns))


# -- durable functions and workflows ----------------------------------------------------------


def _address(target: str) -> str:
    """A worker group's name as the SDKs resolve one (``workers`` is
    ``poll://any@workers``); an address (``scheme://…``) as it is."""
    return target if "://" in target else f"poll://any@{target}"


def invoke(remote: Remote, args: dict[str, Any]) -> Any:
    ns = _namespace(
        {
            "func": args["func"],
            "id": args["id"],
            "arg": None,
            "json_args": _get(args, "args", []),
            "func_version": _get(args, "version", 1),
            "timeout": _get(args, "timeout", "1h"),
            "target": _address(_get(args, "target", "default")),
            "delay": args.get("delay"),
        }
    )
    return _send(remote, _run(requests.invoke, ns))


def tree(remote: Remote, args: dict[str, Any]) -> Any:
    return fetch_tree(remote, args["id"]).as_json()


def explain(remote: Remote, args: dict[str, Any]) -> Any:
    return remote.operator("explain", {"id": args["id"]})


def workers(remote: Remote, args: dict[str, Any]) -> Any:
    return remote.operator("workers", {})


def workflow_cancel(remote: Remote, args: dict[str, Any]) -> Any:
    body = {"id": args["id"], **({"reason": args["reason"]} if args.get("reason") else {})}
    return remote.action("cancel", body, timeout=CANCEL_TIMEOUT)


# -- schedules --------------------------------------------------------------------------------


def schedule_create(remote: Remote, args: dict[str, Any]) -> Any:
    ns = _namespace(
        {
            "id": args["id"],
            "cron": args["cron"],
            "promise_id": args["promiseId"],
            "promise_timeout": _get(args, "promiseTimeout", "1h"),
            "promise_param": _as_json(args.get("promiseParam")),
            "promise_tags": args.get("promiseTags"),
        }
    )
    return _send(remote, _run(requests.schedule_create, ns))


def schedule_search(remote: Remote, args: dict[str, Any]) -> Any:
    ns = _namespace(
        {"tags": args.get("tags"), "limit": _get(args, "limit", 10), "cursor": args.get("cursor")}
    )
    return _send(remote, _run(requests.schedule_search, ns))


def _by_id(kind: str) -> Handler:
    return lambda remote, args: _send(remote, (kind, {"id": args["id"]}))


# -- the table --------------------------------------------------------------------------------

WAIT: Final = "promise-wait"

TOOLS: Final[tuple[Tool, ...]] = (
    Tool(
        "promise-create",
        "Create a durable promise: a value that will exist later, settled by whoever "
        "holds its id (a person, another service, an agent). Use it to park on an "
        "approval or any answer from outside: create it, tell the other party its id, "
        "then call promise-wait. Creating an id that exists changes nothing and "
        "answers the existing promise (check its state). Tagged resonate:external=true so "
        "that promise-wait can listen on it.",
        _schema(
            ["id"],
            id=_with(_ID, "a unique id, e.g. approval-deploy-42"),
            timeout=_with(
                _DURATION,
                "how long until it times out (rejected_timedout) if nobody settles it, "
                "e.g. 30m, 24h (default 1h)",
            ),
            param=_with(_VALUE, 'what the promise is about, e.g. {"data": {"question": "…"}}'),
            tags=_with(_TAGS, "string tags to find it by with promise-search"),
        ),
        promise_create,
        idempotent=True,
    ),
    Tool(
        "promise-get",
        "Read one promise: its state (pending, resolved, rejected, rejected_canceled, "
        "rejected_timedout), param, value and tags. 'decoded' holds param and value "
        "decoded from base64.",
        _schema(["id"], id=_with(_ID, "the promise id")),
        promise_get,
        read_only=True,
        idempotent=True,
    ),
    Tool(
        "promise-settle",
        "Settle a pending promise: resolve it with a value, reject it with an error, or "
        "cancel it. Whoever waits on it (promise-wait, a workflow) resumes with that "
        "value. Settling a promise already settled changes nothing: the answer shows "
        "its actual state and value (check them).",
        _schema(
            ["id", "resolution"],
            id=_with(_ID, "the promise id"),
            resolution={"type": "string", "enum": ["resolve", "reject", "cancel"]},
            value=_with(_VALUE, 'the result or error, e.g. {"data": "approved"}'),
        ),
        promise_settle,
        idempotent=True,
        destructive=True,
    ),
    Tool(
        "promise-search",
        "List promises by state and tags, a page at a time (pass back 'cursor' for the next page).",
        _schema(
            [],
            state={
                "type": "string",
                "enum": [
                    "pending",
                    "resolved",
                    "rejected",
                    "rejected_canceled",
                    "rejected_timedout",
                ],
            },
            tags=_with(_TAGS, 'only promises with these tags, e.g. {"resonate:origin": "wf-1"}'),
            limit=_with(_LIMIT, "at most this many (default 100)"),
            cursor={"type": "string", "description": "the cursor of the previous page"},
        ),
        promise_search,
        read_only=True,
        idempotent=True,
    ),
    Tool(
        WAIT,
        "Wait until a promise settles, or until 'timeout' passes, and return it. Use it "
        "after promise-create or invoke to park until a person or a worker answers. "
        "The server pushes the settlement (a listener on this MCP server's stream), "
        "nothing polls. If it returns with settled=false the promise is still pending: "
        "call promise-wait again (waiting is harmless to repeat). Works on external "
        "promises: those made by promise-create or invoke, a workflow's calls to "
        "worker groups, and the promises a workflow awaits from outside.",
        _schema(
            ["id"],
            id=_with(_ID, "the promise id"),
            timeout=_with(_DURATION, "how long to wait at most, e.g. 30s, 10m (default 60s)"),
        ),
        None,  # registers a listener: harmless, but not a pure read
        idempotent=True,
    ),
    Tool(
        "invoke",
        "Start a durable function on a worker group, as the Resonate SDKs do: the "
        "function's registered name and its arguments go to a worker of the group, "
        "which runs it to completion even across crashes. The call's result becomes "
        "the value of promise 'id': read it with promise-wait or promise-get. "
        "Invoking the same id again does not start a second run.",
        _schema(
            ["func", "id"],
            func=_with(_ID, "the function's registered name"),
            id=_with(_ID, "the call's promise id (unique per call)"),
            args={"type": "array", "description": "the function's arguments (JSON values)"},
            target=_with(
                _ID,
                "the worker group: its name (e.g. workers, as the SDKs' target option "
                "takes it) or an address (poll://any@workers); default: default",
            ),
            version=_with({"type": "integer", "minimum": 1}, "the function's version (1)"),
            timeout=_with(_DURATION, "how long the call may take in all (default 1h)"),
            delay=_with(_DURATION, "start only after this long, e.g. 5m"),
        ),
        invoke,
        idempotent=True,
    ),
    Tool(
        "tree",
        "A workflow's call graph under its root promise: each promise with its state, "
        "the function it runs and its task, children nested. Use it to see how far a "
        "workflow got.",
        _schema(["id"], id=_with(_ID, "the workflow's root promise id")),
        tree,
        read_only=True,
        idempotent=True,
    ),
    Tool(
        "explain",
        "Why a workflow is not done: each blocker with a reason (e.g. no_worker: no "
        "worker of the group is connected; sleeping; awaiting_settlement: someone must "
        "settle an external promise; held: a worker holds its lease) and a sentence "
        "saying what would unblock it. "
        "Needs a troth server (and an admin token when auth is on).",
        _schema(["id"], id=_with(_ID, "a promise id: a workflow's root or any of its promises")),
        explain,
        read_only=True,
        idempotent=True,
    ),
    Tool(
        "workers",
        "The worker groups troth has seen, who is connected in each and since when. "
        "Needs a troth server (and an admin token when auth is on).",
        _schema([]),
        workers,
        read_only=True,
        idempotent=True,
    ),
    Tool(
        "workflow-cancel",
        "Cancel a whole workflow: every pending promise of the tree rooted at 'id' (the "
        "root and every promise of its call graph) is settled rejected_canceled, the "
        "root first. Its workers are refused at their next step, so it runs no further "
        "step; whoever waits on it resumes with rejected_canceled. Calling it again "
        "finishes a cancel that was cut short and otherwise changes nothing. "
        "Needs a troth server (and an admin token when auth is on).",
        _schema(
            ["id"],
            id=_with(_ID, "the workflow's root promise id"),
            reason={"type": "string", "description": "why, kept in the promises' value"},
        ),
        workflow_cancel,
        idempotent=True,
        destructive=True,
    ),
    Tool(
        "schedule-create",
        "Create a schedule: on every tick of 'cron' the server creates a promise from "
        "'promiseId' (a template: {{.id}} the schedule's id, {{.timestamp}} the tick's "
        "time). With a resonate:target tag in promiseTags each tick starts a durable "
        "function call on that worker group.",
        _schema(
            ["id", "cron", "promiseId"],
            id=_with(_ID, "the schedule's id (no '/')"),
            cron=_with(_ID, "a cron expression, e.g. */5 * * * *"),
            promiseId=_with(_ID, "the promise id template, e.g. {{.id}}.{{.timestamp}}"),
            promiseTimeout=_with(_DURATION, "each promise's timeout (default 1h)"),
            promiseParam=_with(_VALUE, "each promise's param"),
            promiseTags=_with(_TAGS, "each promise's tags"),
        ),
        schedule_create,
        idempotent=True,
    ),
    Tool(
        "schedule-get",
        "Read one schedule: its cron, promise template, next and last run.",
        _schema(["id"], id=_with(_ID, "the schedule's id")),
        _by_id("schedule.get"),
        read_only=True,
        idempotent=True,
    ),
    Tool(
        "schedule-delete",
        "Delete a schedule: no more promises are made from it (those made stay).",
        _schema(["id"], id=_with(_ID, "the schedule's id")),
        _by_id("schedule.delete"),
        destructive=True,
    ),
    Tool(
        "schedule-search",
        "List schedules by tags, a page at a time (pass back 'cursor' for the next).",
        _schema(
            [],
            tags=_with(_TAGS, "only schedules with these tags"),
            limit=_with(_LIMIT, "at most this many (default 10)"),
            cursor={"type": "string", "description": "the cursor of the previous page"},
        ),
        schedule_search,
        read_only=True,
        idempotent=True,
    ),
)

BY_NAME: Final = {t.name: t for t in TOOLS}
