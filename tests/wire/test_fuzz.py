"""Wire fuzz: mutated envelopes built from the request shapes of
``troth.protocol.requests`` — wrong types, missing and extra fields, deep nesting,
huge numbers, odd unicode (U+0000, lone surrogates escaped in JSON), truncated bytes,
unknown kinds — on memory, SQLite and PostgreSQL.  For every body: never a 500, an
envelope whose ``head.status`` is the HTTP status, and a 4xx changes nothing
(``debug.snap`` before = after).

Derandomised and bounded for CI (``TROTH_FUZZ_EXAMPLES``, default 200 per backend);
a failure prints the body it sent (``note``) so it can be replayed with ``post_raw``.
"""

from __future__ import annotations

import json
import os
from typing import Any

import hypothesis.strategies as st
import msgspec
from hypothesis import HealthCheck, given, note, settings

from helpers.support import VERSION, RunningServer
from troth.protocol import requests as rq

EXAMPLES = int(os.environ.get("TROTH_FUZZ_EXAMPLES", "200"))
IDS = ["a", "b", "a.1", ""]


def field_names(kind: str) -> list[str]:
    info = msgspec.inspect.type_info(rq.REQUEST_TYPES[kind])
    assert isinstance(info, msgspec.inspect.StructType)
    return [f.encode_name for f in info.fields]


KINDS = [k for k in rq.REQUEST_TYPES if not k.startswith("debug.") or k == "debug.tick"]

odd_text = st.one_of(
    st.sampled_from(IDS),
    st.text(max_size=12),
    st.sampled_from(["\x00", "a\x00b", "\ud800", "\udfff", "\U0010ffff", "\u202e", "é" * 3]),
)
huge = st.sampled_from([2**63, 2**64, -(2**63) - 1, 10**40, -1, 1e308, -0.0, 1.5])
leaf = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**13), huge, odd_text)
json_value = st.recursive(
    leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(odd_text, inner, max_size=3)
    ),
    max_leaves=8,
)


def deep(levels: int) -> str:
    """A placeholder, replaced in the encoded body by a value ``levels`` containers
    deep (``json.dumps`` itself recurses and cannot write one thousands deep)."""
    return f"@@deep{levels}@@"


def expand(raw: bytes) -> bytes:
    for levels in (60, 63, 65, 200, 2000, 3000):
        mark = f'"@@deep{levels}@@"'.encode()
        if mark in raw:
            opened = b"".join(b'{"d":' if i % 2 else b"[" for i in range(levels))
            closed = b"".join(b"}" if i % 2 else b"]" for i in reversed(range(levels)))
            raw = raw.replace(mark, opened + b"1" + closed)
    return raw


def plausible(name: str) -> st.SearchStrategy[Any]:
    """A value of roughly the right shape for a field, to get past the first check."""
    if name in ("timeoutAt", "ttl", "version", "time", "promiseTimeout", "limit"):
        return st.one_of(st.integers(0, 10**13), huge)
    if name in ("tags", "promiseTags"):
        return st.dictionaries(odd_text, odd_text, max_size=2)
    if name in ("param", "value", "promiseParam"):
        return st.fixed_dictionaries({}, optional={"headers": st.just({}), "data": odd_text})
    if name == "tasks":
        return st.lists(st.fixed_dictionaries({"id": odd_text, "version": st.integers(0, 3)}))
    if name in ("action", "actions"):
        action = st.fixed_dictionaries(
            {
                "kind": st.sampled_from(["promise.create", "promise.settle", "nope"]),
                "head": st.just({}),
                "data": st.fixed_dictionaries(
                    {"id": odd_text, "timeoutAt": st.integers(0, 10**13)},
                    optional={"state": st.sampled_from(["resolved", "pending", "x"])},
                ),
            }
        )
        return st.lists(action, max_size=2) if name == "actions" else action
    if name == "state":
        return st.sampled_from(["resolved", "rejected", "rejected_canceled", "pending", "?"])
    if name == "address":
        return st.sampled_from(["poll://any@g", "http://127.0.0.1:1/x", "???"])
    if name == "cron":
        return st.sampled_from(["* * * * *", "0 0 31 2 *", "bad"])
    return odd_text


@st.composite
def data_for(draw: st.DrawFn, kind: str) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for name in field_names(kind):
        choice = draw(st.integers(0, 9))
        if choice == 0:
            continue  # missing
        data[name] = draw(json_value) if choice == 1 else draw(plausible(name))
    if draw(st.integers(0, 4)) == 0:
        data[draw(odd_text)] = draw(json_value)  # extra
    return data


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.one_of(st.sampled_from(KINDS), odd_text))
    data: Any = draw(data_for(kind)) if kind in rq.REQUEST_TYPES else draw(json_value)
    head: Any = {"corrId": draw(st.one_of(st.just("fz"), odd_text)), "version": VERSION}
    env: Any = {"kind": kind, "head": head, "data": data}
    mutation = draw(st.integers(0, 11))
    if mutation == 0:
        env[draw(st.sampled_from(["kind", "head", "data"]))] = draw(json_value)
    elif mutation == 1:
        del env[draw(st.sampled_from(["kind", "head", "data"]))]
    elif mutation == 2:
        head["version"] = draw(odd_text)
    elif mutation == 3:
        head["resonate:debug_time"] = draw(st.one_of(huge, odd_text, st.integers(0, 10**13)))
    elif mutation == 4:
        where = draw(st.sampled_from(["kind", "head", "data", "x"]))
        env[where] = deep(draw(st.sampled_from([63, 65, 200, 3000])))
    elif mutation == 5 and isinstance(data, dict) and data:
        data[draw(st.sampled_from(sorted(data)))] = deep(draw(st.sampled_from([60, 2000])))
    elif mutation == 6:
        env = draw(json_value)  # not an envelope at all
    raw = json.dumps(env, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")
    raw = expand(raw)
    if mutation == 7:
        raw = raw[: draw(st.integers(0, max(0, len(raw) - 1)))]  # truncated
    elif mutation == 8:
        raw = raw.replace(b'"fz"', b'"\\ud800"')  # a lone surrogate, escaped
    elif mutation == 9:
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.binary(min_size=1, max_size=4)) + raw[at:]
    return raw


@given(body=bodies())
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_no_input_gets_a_500_and_refusals_change_nothing(
    server: RunningServer, body: bytes
) -> None:
    note(f"post_raw(server, {body!r})")
    before = server.snap()
    r = server.client.post("/", content=body, headers={"content-type": "application/json"})
    assert r.status_code < 500 or r.status_code == 503, (r.status_code, r.text)
    answer = r.json()
    assert answer["head"]["status"] == r.status_code, answer
    assert isinstance(answer["kind"], str) and isinstance(answer["head"]["corrId"], str)
    if 400 <= r.status_code < 500:
        assert server.snap() == before, answer
    elif r.status_code == 200 and answer["kind"] == "debug.tick":
        pass  # a tick may fire deadlines: it changes the store by design
