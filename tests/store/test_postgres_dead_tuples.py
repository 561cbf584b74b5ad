"""The statements the PostgreSQL store runs most do not walk dead row versions.

While a snapshot holds the database's xmin horizon back (a ``pg_dump``, a long report),
VACUUM removes nothing, and an index walk that passes dead entries costs more each
second.  These tests hold a snapshot, churn rows the way delivery does, and read the
plans and buffer counts of the statements themselves (``EXPLAIN (ANALYZE, BUFFERS)``,
generic and custom plans both): each must find its rows without visiting what the
churn left dead.  ``python -m troth_bench.horizon`` measures the same under load.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg.sql
import pytest

from helpers import pg
from troth.outbox.rows import RowState, Settlement
from troth.protocol.records import EARLIEST
from troth.store.postgres import PostgresStore
from troth.store.postgres.rows import Q

#: Dead versions the churn leaves; a walk past them costs at least one buffer each page.
CHURN = 5_000


@pytest.fixture
def url() -> Iterator[str]:
    """A database of its own: its tables' statistics are what each test makes them."""
    with pg.throwaway_database("troth_dead") as url:
        PostgresStore(url).close()  # migrated
        yield url


def scans(plan: dict[str, Any]) -> list[str]:
    """``Index Scan outbox_pkey``, ``Seq Scan promises``, … of a JSON plan."""
    out: list[str] = []
    if "Scan" in plan["Node Type"]:
        out.append(f"{plan['Node Type']} {plan.get('Index Name', plan.get('Relation Name'))}")
    for child in plan.get("Plans", []):
        out.extend(scans(child))
    return out


def explain(
    conn: psycopg.Connection[Any], sql: str, types: list[str], args: list[Any], mode: str
) -> tuple[list[str], int]:
    """The scans of ``sql``'s plan and the shared buffers it touched, prepared as the
    server's connections prepare it (``$n`` placeholders) and run in a rolled-back
    transaction, with ``plan_cache_mode`` set to ``mode``."""
    n = iter(range(1, len(types) + 1))
    named: dict[str, int] = {}  # %(name)s: one $n per name, in order of appearance

    def placeholder(m: re.Match[str]) -> str:
        if m.group(1) is None:
            return f"${next(n)}"
        if m.group(1) not in named:
            named[m.group(1)] = next(n)
        return f"${named[m.group(1)]}"

    prepared = re.sub(r"%(?:\((\w+)\))?[bs]", placeholder, sql)
    conn.execute(f"SET plan_cache_mode = {mode}")
    signature = f" ({', '.join(types)})" if types else ""
    # The simple query protocol: over the extended one, $n would be the PREPARE's own.
    result = conn.pgconn.exec_(f"PREPARE probe{signature} AS {prepared}".encode())
    assert result.status == psycopg.pq.ExecStatus.COMMAND_OK, result.error_message
    literals = [
        f"{psycopg.sql.Literal(a).as_string(conn)}::{t}" for a, t in zip(args, types, strict=True)
    ]
    values = f" ({', '.join(literals)})" if literals else ""
    try:
        row = conn.execute(
            f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE probe{values}"
        ).fetchone()
    finally:
        conn.rollback()
    assert row is not None
    top = row[0][0]["Plan"]
    return scans(top), top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)


def holding(url: str) -> psycopg.Connection[Any]:
    """A REPEATABLE READ transaction that took its snapshot, as ``pg_dump`` does."""
    conn = psycopg.connect(url)
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    conn.execute("SELECT 1 FROM outbox LIMIT 1")
    return conn


def outbox_row(state: str, token: str | None, at: int = 1) -> str:
    """The start of an INSERT of rows made, due and claimed at ``at``."""
    return (
        "INSERT INTO outbox (key, address, kind, created_at, state, available_at, claim_token,"
        f" claimed_at, updated_at) SELECT 'k' || g, 'poll://any@g', 'execute', {at}, '{state}',"
        f" {at}, {'NULL' if token is None else repr(token)}, {at}, {at}"
    )


@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
def test_settling_claims_finds_each_row_by_its_id_not_past_dead_claims(url: str, mode: str) -> None:
    holder = holding(url)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            # Delivered rows: each passed through dispatching and was settled.
            conn.execute(outbox_row("dispatching", "old") + f" FROM generate_series(1, {CHURN}) g")
            conn.execute("UPDATE outbox SET state = 'completed', claim_token = NULL")
            conn.execute(outbox_row("dispatching", "tok") + " FROM generate_series(0, 0) g")
            conn.execute("ANALYZE outbox")
            (held,) = conn.execute("SELECT id FROM outbox WHERE claim_token = 'tok'").fetchone()  # type: ignore[misc]
        with psycopg.connect(url) as conn:
            found, buffers = explain(
                conn,
                Q["finish_many"],
                ["bigint[]", "text[]", "text[]", "int[]", "text[]", "text[]"],
                [[held], ["tok"], ["completed"], [0], ["200"], ["2"]],
                mode,
            )
    finally:
        holder.close()
    assert [s for s in found if not s.startswith("Function Scan")] == ["Index Scan outbox_pkey"], (
        found
    )
    assert buffers < 20, f"{buffers} buffers to settle one claim: {found}"


def deliver_claimed_at_10(url: str) -> None:
    """:data:`CHURN` rows claimed at 10 and delivered at 11: a dead ``dispatching``
    version of each stays while the horizon is held."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = outbox_row("dispatching", "old", at=10)
        conn.execute(row + f" FROM generate_series(1, {CHURN}) g")
        conn.execute("UPDATE outbox SET state = 'completed', claim_token = NULL, updated_at = 11")
        conn.execute("ANALYZE outbox")


@pytest.mark.parametrize(
    ("name", "types", "args"),
    [
        ("release_expired", ["text", "numeric", "numeric"], ["x", 9, 5]),
        ("purge_completed", ["numeric", "numeric"], [5, 5]),
        ("unknown_rows", ["bigint"], [100]),
    ],
)
def test_the_maintenance_sweeps_pass_no_dead_claims(
    url: str, name: str, types: list[str], args: list[Any]
) -> None:
    """The reaper (claims older than the cutoff), the purge (completed rows older than
    the retention) and the reconciler's read (rows of unknown outcome) of an outbox
    whose every row was delivered after the cutoff, while the horizon is held."""
    holder = holding(url)
    try:
        deliver_claimed_at_10(url)
        with psycopg.connect(url) as conn:
            found, buffers = explain(conn, Q[name], types, args, "force_custom_plan")
    finally:
        holder.close()
    assert buffers < 20, f"{buffers} buffers for {name}: {found}"


def test_the_next_deadline_reads_small_indexes_also_before_statistics_exist(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        # A table the planner knows nothing of (never analyzed): no undrained promise.
        conn.execute("ALTER TABLE promises SET (autovacuum_enabled = off)")
        conn.execute(
            "INSERT INTO promises (id, state, param, value, tags, timeout_at, created_at,"
            " callbacks, listeners, external, undrained) SELECT 'p' || g, 'resolved', '{}',"
            f" '{{}}', '{{}}', 1, 1, '[]', '[]', false, false FROM generate_series(1, {CHURN}) g"
        )
    with psycopg.connect(url) as conn:
        found, buffers = explain(conn, Q["next_deadline"], [], [], "auto")
    assert not any(s.startswith("Seq Scan") for s in found), found
    assert buffers < 20, f"{buffers} buffers for the next deadline: {found}"


def finish_tasks(conn: psycopg.Connection[Any]) -> None:
    """:data:`CHURN` tasks pending (retry at 10), then acquired (lease until 20), then
    finished: a dead entry of each in both deadline indexes while the horizon is held."""
    conn.execute(
        "INSERT INTO tasks (id, state, version, retry_at, resumes) SELECT 't' || g,"
        f" 'pending', 0, 10, '[]' FROM generate_series(1, {CHURN}) g"
    )
    conn.execute("UPDATE tasks SET state = 'acquired', expires_at = 20, retry_at = NULL")
    conn.execute("UPDATE tasks SET state = 'fulfilled', expires_at = NULL")


@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
def test_the_next_deadline_within_bounds_passes_no_dead_tasks(url: str, mode: str) -> None:
    """Tasks that were pending (retry at 10) and then acquired (lease until 20) and
    finished, while the horizon is held: the timer's bounded read, from a floor of 30,
    walks none of their dead entries; the unbounded read walks them all."""
    holder = holding(url)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            finish_tasks(conn)
            conn.execute("ANALYZE tasks")
        with psycopg.connect(url) as conn:
            types, args = ["numeric", "numeric"], [30, 5_030]
            found, bounded = explain(conn, Q["next_deadline_within"], types, args, mode)
        with psycopg.connect(url) as conn:
            _, unbounded = explain(conn, Q["next_deadline"], [], [], mode)
    finally:
        holder.close()
    assert bounded < 20, f"{bounded} buffers for the bounded next deadline: {found}"
    assert unbounded > 10 * bounded, (unbounded, bounded)


@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
def test_the_reaper_from_its_floor_passes_no_dead_claims(url: str, mode: str) -> None:
    """Rows claimed at 10 and delivered, while the horizon is held: the reaper's pass
    from its last cutoff (30) to its cutoff walks none of their dead entries; a pass
    from the bottom walks them all."""
    holder = holding(url)
    try:
        deliver_claimed_at_10(url)
        types = ["text", "numeric", "numeric", "numeric"]
        with psycopg.connect(url) as conn:
            args = ["x", 5_040, 30, 5_030]
            found, bounded = explain(conn, Q["release_expired_since"], types, args, mode)
        with psycopg.connect(url) as conn:
            args = ["x", 5_040, 5_030]
            _, unbounded = explain(conn, Q["release_expired"], types[:3], args, mode)
    finally:
        holder.close()
    assert bounded < 20, f"{bounded} buffers for the reaper from its floor: {found}"
    assert unbounded > 10 * bounded, (unbounded, bounded)


def test_settlements_keep_to_the_index_as_the_outbox_grows_from_empty(url: str) -> None:
    """A plan made while the outbox was empty is not the one used once it is big: the
    dispatcher's settlements of a grown table scan no table, before autovacuum ever
    analysed it.  Their plans come from the server itself: ``auto_explain`` sends
    each statement's plan to the session that ran it, as a notice."""
    with psycopg.connect(url, autocommit=True) as admin:
        db = pg.dbname_of(url)
        for setting, value in (
            ("session_preload_libraries", "auto_explain"),
            ("auto_explain.log_min_duration", "0"),
            ("auto_explain.log_level", "notice"),
        ):
            admin.execute(f"ALTER DATABASE {db} SET {setting} = '{value}'")
        admin.execute("ALTER TABLE outbox SET (autovacuum_enabled = off)")
    store = PostgresStore(url)
    plans: list[str] = []
    admin = psycopg.connect(url, autocommit=True)
    try:
        conn = store.outbox.session.conn
        conn.add_notice_handler(lambda d: plans.append(str(d.message_primary)))

        def settle_claims(token: str, count: int) -> None:
            admin.execute(outbox_row("dispatching", token) + f" FROM generate_series(1, {count}) g")
            ids = admin.execute(
                "SELECT id FROM outbox WHERE claim_token = %s ORDER BY id", (token,)
            ).fetchall()
            plans.clear()
            for (id,) in ids:  # one by one: the dispatcher's settlements of one send each
                done = store.outbox.settle([Settlement(id, token, RowState.COMPLETED, 2, "200")])
                assert done == [True]

        settle_claims("small", 10)  # planned (and cached, were it so) on an empty table
        admin.execute(
            outbox_row("completed", None).replace("'k' || g", "'grown' || g")
            + f" FROM generate_series(1, {CHURN * 4}) g"
        )
        settle_claims("big", 10)
    finally:
        store.close()
        admin.close()
    settling = [p for p in plans if "UPDATE outbox AS o" in p]
    assert len(settling) == 10, plans
    assert not any("Seq Scan" in p for p in settling), settling[-1]


@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
def test_a_timer_pass_from_the_floor_passes_no_dead_deadlines(url: str, mode: str) -> None:
    """Tasks pending (retry at 10), then acquired (lease until 20) and finished;
    external promises that timed out at 10 and were settled; a schedule that ran at
    10 and moved on — all while the horizon is held.  A pass's due lists from the
    timer's floor (30) up to now (5,030) walk none of their dead entries; from the
    bottom they walk them all."""
    holder = holding(url)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            finish_tasks(conn)
            conn.execute(
                "INSERT INTO promises (id, state, param, value, tags, timeout_at, created_at,"
                " callbacks, listeners, external, undrained) SELECT 'p' || g, 'pending', '{}',"
                f" '{{}}', '{{}}', 10, 1, '[]', '[]', true, false FROM generate_series(1, {CHURN}) g"
            )
            conn.execute("UPDATE promises SET state = 'rejected_timedout', settled_at = 10")
            conn.execute(
                "INSERT INTO schedules (id, cron, promise_id, promise_timeout, promise_param,"
                " promise_tags, created_at, next_run_at) SELECT 's' || g, '* * * * *', 'x', 1,"
                f" '{{}}', '{{}}', 1, 10 FROM generate_series(1, {CHURN // 5}) g"
            )
            for k in range(1, 6):  # each run moves next_run_at on, leaving a dead entry
                conn.execute(f"UPDATE schedules SET next_run_at = {10 + k}")
            conn.execute("UPDATE schedules SET next_run_at = 1000000")
            conn.execute("ANALYZE tasks, promises, schedules")
        types = ["numeric", "numeric", "int"]  # now, since, limit
        for name in ("due_tasks", "due_promises", "due_schedules"):
            with psycopg.connect(url) as conn:
                found, bounded = explain(conn, Q[name], types, [5_030, 30, 64], mode)
            with psycopg.connect(url) as conn:
                _, unbounded = explain(conn, Q[name], types, [5_030, EARLIEST, 64], mode)
            assert bounded < 20, f"{bounded} buffers for {name} from the floor: {found}"
            assert unbounded > 10 * bounded, (name, unbounded, bounded)
    finally:
        holder.close()
