"""What each client command sends: one protocol request ``(kind, data)`` built from
its parsed flags.

Apart from the parsers (cli/client.py) so that the MCP tools (cli/mcp/tools.py) build
the very same requests as the commands they mirror, and a flag's meaning cannot drift
between the two.
"""

from __future__ import annotations

import argparse
import base64
import json
import time
from collections.abc import Callable
from typing import Any

from troth.cli import bulk
from troth.durations import parse_duration

Request = tuple[str, dict[str, Any]]


class Usage(Exception):
    """A flag's value cannot be used (exit 2)."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def duration(text: str, flag: str) -> int:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise Usage(f"{flag}: {exc}") from None


def json_arg(text: str, flag: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise Usage(f"{flag} is not JSON: {exc}") from None


def value_arg(text: str | None, flag: str) -> dict[str, Any] | None:
    """A value flag (``{"headers": …, "data": …}``): ``data`` goes out base64-encoded,
    a string as its text, anything else as its JSON."""
    if text is None:
        return None
    value = json_arg(text, flag)
    if not isinstance(value, dict):
        raise Usage(f'{flag} must be a JSON object such as {{"data": "hello"}}')
    if "data" in value and value["data"] is not None:
        data = value["data"]
        raw = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
        value["data"] = base64.b64encode(raw.encode()).decode()
    return value


def tags_arg(text: str | None, flag: str) -> dict[str, str] | None:
    if text is None:
        return None
    tags = json_arg(text, flag)
    if not isinstance(tags, dict) or not all(isinstance(v, str) for v in tags.values()):
        raise Usage(f'{flag} must be a JSON object of strings such as {{"k": "v"}}')
    return tags


def with_optional(data: dict[str, Any], **optional: Any) -> dict[str, Any]:
    data.update({k: v for k, v in optional.items() if v is not None})
    return data


# -- promises ---------------------------------------------------------------------------------


def promise_create(a: argparse.Namespace) -> Request:
    return "promise.create", _promise_data(a)


def _promise_data(a: argparse.Namespace) -> dict[str, Any]:
    """A new promise from ``id``, ``--timeout``, ``--param`` and ``--tags``."""
    return {
        "id": a.id,
        "timeoutAt": now_ms() + duration(a.timeout, "--timeout"),
        "param": value_arg(a.param, "--param") or {},
        "tags": tags_arg(a.tags, "--tags") or {},
    }


def promise_settle(state: str) -> Callable[[argparse.Namespace], Request]:
    """One promise by its ID, or (filters instead) every pending one found (bulk.py)."""

    def build(a: argparse.Namespace) -> Request:
        problem = bulk.misuse(a)
        if problem is not None:
            raise Usage(problem)
        value = value_arg(a.value, "--value") or {}
        if a.id is None:
            return bulk.KIND, bulk.job(state, value, tags_arg(a.tags, "--tags"), a.id_prefix)
        return "promise.settle", {"id": a.id, "state": state, "value": value}

    return build


def promise_search(a: argparse.Namespace) -> Request:
    data = with_optional({"limit": a.limit}, state=a.state, cursor=a.cursor)
    return "promise.search", with_optional(data, tags=tags_arg(a.tags, "--tags"))


# -- tasks ------------------------------------------------------------------------------------


def task_create(a: argparse.Namespace) -> Request:
    create = _promise_data(a)
    # A task belongs to a targeted promise (the specification refuses one without).
    create["tags"].setdefault("resonate:target", a.target)
    action = {"kind": "promise.create", "head": {}, "data": create}
    return "task.create", {"pid": a.pid, "ttl": duration(a.ttl, "--ttl"), "action": action}


def task_acquire(a: argparse.Namespace) -> Request:
    ttl = duration(a.ttl, "--ttl")
    return "task.acquire", {"id": a.id, "version": a.version, "pid": a.pid, "ttl": ttl}


def task_action(kind: str) -> Callable[[argparse.Namespace], Request]:
    def build(a: argparse.Namespace) -> Request:
        action = json_arg(a.action, "--action")
        return kind, {"id": a.id, "version": a.version, "action": action}

    return build


def task_suspend(a: argparse.Namespace) -> Request:
    actions = json_arg(a.actions, "--actions")
    if not isinstance(actions, list):
        raise Usage("--actions must be a JSON array of promise.register_callback actions")
    return "task.suspend", {"id": a.id, "version": a.version, "actions": actions}


def task_heartbeat(a: argparse.Namespace) -> Request:
    tasks = json_arg(a.tasks, "--tasks")
    if not isinstance(tasks, list):
        raise Usage('--tasks must be a JSON array such as [{"id": "t", "version": 1}]')
    return "task.heartbeat", {"pid": a.pid, "tasks": tasks}


def task_search(a: argparse.Namespace) -> Request:
    return "task.search", with_optional({"limit": a.limit}, state=a.state, cursor=a.cursor)


# -- schedules --------------------------------------------------------------------------------


def schedule_create(a: argparse.Namespace) -> Request:
    data = with_optional(
        {
            "id": a.id,
            "cron": a.cron,
            "promiseId": a.promise_id,
            "promiseTimeout": duration(a.promise_timeout, "--promise-timeout"),
        },
        promiseParam=value_arg(a.promise_param, "--promise-param"),
        promiseTags=tags_arg(a.promise_tags, "--promise-tags"),
    )
    data.setdefault("promiseParam", {})
    data.setdefault("promiseTags", {})
    return "schedule.create", data


def schedule_search(a: argparse.Namespace) -> Request:
    data = with_optional({"limit": a.limit}, cursor=a.cursor)
    return "schedule.search", with_optional(data, tags=tags_arg(a.tags, "--tags"))


# -- invoke -----------------------------------------------------------------------------------


def invoke(a: argparse.Namespace) -> Request:
    """A durable function call as the SDKs start one: the promise's param carries
    ``{"func", "args", "version"}`` (base64 JSON), its target tag the worker group."""
    if a.json_args is not None:
        args = json_arg(a.json_args, "--json-args")
        if not isinstance(args, list):
            raise Usage("--json-args must be a JSON array")
    else:
        args = []
        for arg in a.arg or []:
            try:
                args.append(json.loads(arg))
            except ValueError:
                args.append(arg)  # a plain string
    if a.func_version < 1:
        raise Usage("--version must be 1 or more")
    delay = duration(a.delay, "--delay") if a.delay else 0
    call = {"func": a.func, "args": args, "version": a.func_version}
    encoded = base64.b64encode(json.dumps(call, separators=(",", ":")).encode()).decode()
    tags = {"resonate:target": a.target}
    start = now_ms()
    if delay:
        tags["resonate:delay"] = str(start + delay)
    data = {
        "id": a.id,
        "timeoutAt": start + delay + duration(a.timeout, "--timeout"),
        "param": {"headers": {}, "data": encoded},
        "tags": tags,
    }
    return "promise.create", data
