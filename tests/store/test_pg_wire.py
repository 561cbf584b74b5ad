"""The PostgreSQL wire (troth/pgwire/): statements through libpq's pipeline
calls, each prepared once per connection, answered as psycopg would answer them.

Against a real PostgreSQL (tests/helpers/pg.py): these tests fail, not skip, without it.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from troth.pgwire import Unencodable, Wire, WireCursor, encode, libpq, params, pipeline
from troth.store.postgres.session import IntLoader, TextArray


@pytest.fixture(params=["gil-held", "psycopg"])
def conn(request: pytest.FixtureRequest, pg_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection with a small table; both ways of sending (libpq called holding
    the GIL, and psycopg's wrapper) must answer the same."""
    if request.param == "psycopg":
        mp = pytest.MonkeyPatch()
        mp.setattr(pipeline, "loaded_libpq", lambda: None)
        request.addfinalizer(mp.undo)
    c = psycopg.connect(pg_url, autocommit=False)
    c.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
    c.adapters.register_loader("numeric", IntLoader)
    c.execute("DROP TABLE IF EXISTS wire_t")
    c.execute("CREATE TABLE wire_t (id text PRIMARY KEY, n numeric, flag bool, note text)")
    c.execute("INSERT INTO wire_t VALUES ('a', 1, true, NULL), ('b', 20000000000, false, 'x')")
    c.commit()
    yield c
    c.close()
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("DROP TABLE wire_t")


def _prepared(c: psycopg.Connection[Any]) -> set[str]:
    return {r[0] for r in c.execute("SELECT name FROM pg_prepared_statements").fetchall()}


def test_the_gil_holding_libpq_is_found_here() -> None:
    """On Linux the process's libpq is found, so the fast path is the one that runs."""
    assert libpq.loaded_libpq() is not None


def test_placeholders_become_numbered_parameters() -> None:
    p = params.Parsed("SELECT %s, %b WHERE x LIKE 'a%%'")
    assert (p.query, p.names, p.kinds) == (b"SELECT $1, $2 WHERE x LIKE 'a%'", (0, 1), ("s", "b"))
    q = params.Parsed("SELECT %(a)s, %(b)b, %(a)s")
    assert (q.query, q.names) == (b"SELECT $1, $2, $1", ("a", "b"))
    with pytest.raises(ValueError, match="mixes"):
        params.Parsed("SELECT %s, %(a)s")


def test_values_are_encoded_with_their_types() -> None:
    assert encode("é", "s") == ("é".encode(), 0, 0)
    assert encode("x", "b") == (b"x", 25, 0)
    assert encode(None, "s") == (None, 0, 0)
    assert encode(True, "s") == (b"t", 16, 0)  # a bool is not sent as an int
    assert encode(7, "s") == (b"7", 20, 0)
    assert encode(2**70, "s") == (str(2**70).encode(), 1700, 0)
    assert encode([True, None], "b")[1:] == (1000, 1)
    assert encode(TextArray(["a", None, 3]), "b")[1:] == (1009, 1)
    with pytest.raises(Unencodable):
        encode(Jsonb({}), "s")
    with pytest.raises(Unencodable):
        encode(TextArray([True]), "b")


def test_rows_come_back_typed_and_statements_are_prepared_on_their_second_use(
    conn: psycopg.Connection[Any],
) -> None:
    w = Wire(conn)
    sql = "SELECT id, n, flag, note FROM wire_t WHERE id = ANY(%b) ORDER BY id"
    [rows] = w.run([(sql, (TextArray(["a", "b"]),))])
    assert rows == [("a", 1, True, None), ("b", 20000000000, False, "x")]
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS  # BEGIN sent
    assert not w.prepared  # sent once: not prepared (it may never come again)
    assert w.run([(sql, (TextArray(["a"]),))]) == [[("a", 1, True, None)]]
    names = set(w.prepared.values())
    assert len(names) == 1
    [again] = w.run([(sql, (TextArray(["b"]),))])
    assert again == [("b", 20000000000, False, "x")]
    assert set(w.prepared.values()) == names  # not prepared a second time
    conn.rollback()  # psycopg's own ROLLBACK: the wire's statements outlive it
    assert {n.decode() for n in names} <= _prepared(conn)
    assert w.run([(sql, (TextArray(["a"]),))]) == [[("a", 1, True, None)]]


def test_several_statements_one_round_trip_with_counts(conn: psycopg.Connection[Any]) -> None:
    w = Wire(conn)
    out = w.run(
        [
            ("UPDATE wire_t SET note = %(note)s WHERE n > %(n)s", {"note": "big", "n": 5}),
            ("SET LOCAL enable_seqscan = off", None),
            ("SELECT id, note FROM wire_t WHERE flag = ANY(%s) ORDER BY id", ([False],)),
            ("INSERT INTO wire_t VALUES (%s, %s, %s, %s)", ("c", None, None, "new")),
        ]
    )
    assert out == [None, None, [("b", "big")], None]
    assert w.counts == [1, -1, 1, 1]
    conn.commit()
    assert conn.execute("SELECT note FROM wire_t WHERE id = 'c'").fetchone() == ("new",)


def test_the_first_error_is_raised_and_the_rest_skipped(conn: psycopg.Connection[Any]) -> None:
    """The failed statement's error, with its SQLSTATE; the transaction is left
    aborted (nothing after it ran), and a Parse that the abort skipped is not taken
    for prepared: the statement works on the next attempt."""
    w = Wire(conn)
    later = "UPDATE wire_t SET note = %s WHERE id = %s"
    w.run([(later, ("first", "b"))])  # one use: the next one prepares it
    conn.commit()
    with pytest.raises(psycopg.errors.UniqueViolation) as caught:
        w.run(
            [
                ("INSERT INTO wire_t (id) VALUES (%s)", ("a",)),
                (later, ("skipped", "a")),
            ]
        )
    assert caught.value.sqlstate == "23505"
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
    assert not any(key[0] == later for key in w.prepared)
    conn.rollback()
    assert w.run([(later, ("ran", "a"))]) == [None] and w.counts == [1]
    conn.commit()
    assert conn.execute("SELECT note FROM wire_t WHERE id = 'a'").fetchone() == ("ran",)


def test_a_cursor_sends_what_the_wire_cannot_through_psycopg(
    conn: psycopg.Connection[Any],
) -> None:
    cur = WireCursor(conn)
    sql = "SELECT id FROM wire_t WHERE to_jsonb(note) = %s ORDER BY id"
    assert cur.execute(sql, (Jsonb("x"),)).fetchall() == [("b",)]
    assert cur.execute("SELECT count(*) FROM wire_t").fetchone() == (2,)
    out = cur.run([("SELECT %s::jsonb", (Jsonb({"k": 1}),)), ("SELECT 1", None)])
    assert out == [[({"k": 1},)], [(1,)]]
    assert cur.execute("DELETE FROM wire_t WHERE id = %s", ("a",)).rowcount == 1


def test_a_lost_connection_is_an_operational_error_and_leaves_it_closed(
    conn: psycopg.Connection[Any], pg_url: str
) -> None:
    w = Wire(conn)
    pid = conn.info.backend_pid
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(psycopg.OperationalError):
        w.run([("SELECT id FROM wire_t WHERE id = %s", ("a",))])
    assert conn.closed


def test_a_connection_above_select_s_descriptor_limit_is_waited_on(pg_url: str) -> None:
    """A node holding thousands of SSE sockets may reopen its PostgreSQL connection on
    a descriptor above 1024, where ``select`` cannot wait: the wire waits with poll."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < 1200: raise it (ulimit -Hn) to run this")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        c = psycopg.connect(pg_url, autocommit=True)
        try:
            assert c.pgconn.socket > 1024
            assert Wire(c).run([("SELECT %s::int + 1", (41,))]) == [[(42,)]]
        finally:
            c.close()
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
